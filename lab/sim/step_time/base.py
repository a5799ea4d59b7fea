"""StepTimeModel: the base class of the `sim/step_time` group, and SimTarget, what a model binds to.

The simulator (`executor=sim`, lab/executor/sim.py) asks its step-time model for the duration of
every step from the step's `StepShape` (tokens, prefill chunks, decodes, attention pairs, decode
context, swapped blocks) and advances its virtual clock by it. Hydra builds the model from
lab/conf/sim/step_time/*.yaml without knowing the model or the device; the executor then calls
`bind(target)`, which returns a model ready to predict (a new object: the one Hydra built is
never changed).

With tensor parallelism the target's model is the shape of one rank
(`ModelShape.from_hf_config(cfg, tensor_parallel_size)`): `predict` is one rank's compute, and
the step's collectives are the target's `comm_seconds(shape)` (lab/sim/comm.py), which the
executor adds to every model's prediction (unless the model's `includes_comm` says its
prediction has them already, e.g. a profile fitted to runs at the same tensor_parallel_size).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from lab.core.step import StepShape
from lab.sim.comm import AllReduceModel, RingAllReduce, step_comm_seconds
from lab.sim.device import DeviceSpec
from lab.sim.model_shape import ModelShape


@dataclass(frozen=True)
class SimTarget:
    """The simulated model on the simulated device, with the byte widths the run uses; with
    tensor parallelism, one rank of `model.tensor_parallel_size` and the all-reduce between
    them (None: the device's ring, `RingAllReduce.for_device`)."""

    model: ModelShape  # the whole model, or one rank's shape
    device: DeviceSpec
    dtype_bytes: float  # weights and activations (4 for fp32, 2 for bf16)
    linear_bytes: float  # linear-layer weights (quantized: 1 for fp8/int8, 0.5 for w4a16)
    kv_dtype_bytes: float  # KV-cache elements (1 for cache.dtype=fp8)
    allreduce: AllReduceModel | None = None

    def __post_init__(self) -> None:
        tp = self.tensor_parallel_size
        if self.allreduce is None:
            object.__setattr__(self, "allreduce", RingAllReduce.for_device(self.device, tp))
        elif self.allreduce.world_size != tp:
            raise ValueError(f"an all-reduce model of {self.allreduce.world_size} ranks for a "
                             f"model split over tensor_parallel_size={tp}")

    @property
    def tensor_parallel_size(self) -> int:
        return self.model.tensor_parallel_size

    @property
    def kv_bytes_per_token(self) -> int:
        """Of one rank's cache, over all layers."""
        return self.model.kv_bytes_per_token(self.kv_dtype_bytes)

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        """Of one rank's cache, in one layer."""
        return self.model.kv_bytes_per_token_per_layer(self.kv_dtype_bytes)

    @property
    def weight_bytes(self) -> int:
        """Of one rank's parameters."""
        return self.model.weight_bytes(self.dtype_bytes, self.linear_bytes)

    def comm_seconds(self, shape: StepShape) -> float:
        """Seconds of the step's tensor-parallel collectives (lab/sim/comm.py; 0 at TP=1)."""
        if self.model.tensor_parallel_size == 1:
            return 0.0
        return step_comm_seconds(self.model, self.allreduce, self.dtype_bytes, shape)


class StepTimeModel(ABC):
    """Predicts the seconds one engine step takes on the simulated device."""

    #: True when `predict` already holds the step's tensor-parallel collectives (e.g. a model
    #: fitted to measured steps at the run's tensor_parallel_size): the executor then adds no
    #: `SimTarget.comm_seconds` of its own
    includes_comm: bool = False

    def bind(self, target: SimTarget) -> StepTimeModel:
        """A model of the same kind ready to predict for `target` (default: this one, for
        models that need neither the model's shape nor the device)."""
        return self

    @abstractmethod
    def predict(self, shape: StepShape) -> float:
        """Seconds of a step of this shape (schedule + forward + update; >= 0)."""

    def describe(self) -> str:
        """What a run's summary says about its step times (which model, which mode)."""
        return type(self).__name__
