"""ParallelConfig: how the engine's model is split over ranks. Plain data (no torch import), so
the engine's WorkerConfig can carry it; the groups themselves are lab/distributed/parallel_state.py's."""

from __future__ import annotations

from dataclasses import dataclass

BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class ParallelConfig:
    """How many ranks the engine's model is split over (the `tensor_parallel_size` knob)."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    backend: str = "auto"  # auto: nccl on CUDA, gloo on CPU

    def __post_init__(self) -> None:
        if int(self.tensor_parallel_size) < 1:
            raise ValueError(f"tensor_parallel_size={self.tensor_parallel_size} must be >= 1")
        for name in ("pipeline_parallel_size", "data_parallel_size"):
            if getattr(self, name) != 1:
                raise ValueError(f"{name}={getattr(self, name)}: only 1 is supported (pipeline "
                                 "and data parallelism have their groups but no runner yet)")
        if self.backend not in BACKENDS:
            raise ValueError(f"distributed backend={self.backend!r}: use one of {', '.join(BACKENDS)}")

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    def backend_for(self, device_type: str) -> str:
        """The process group's backend on a device of this type ("cuda", "cpu")."""
        if self.backend != "auto":
            return self.backend
        return "nccl" if device_type == "cuda" else "gloo"
