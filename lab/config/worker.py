"""WorkerConfig: everything a worker needs to load its model and run steps, built once by the
engine's builder (lab/engine/builder.py) from the composed config and handed to the executor,
which builds its worker(s) from it — or, for the simulator, reads the sizes it models.

Plain data (no torch import), frozen: a worker cannot change what the engine decided. The knobs
travel as the one typed object they are declared as (EngineKnobs), so a new knob reaches the
worker without a field here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.config.knobs import EngineKnobs
from lab.distributed.config import ParallelConfig


@dataclass(frozen=True)
class WorkerConfig:
    """The worker's half of the engine config: the model, the components, the knobs."""

    model_path: Path
    attention: Any  # AttentionBackend (lab/conf/attention)
    kernels: Any  # LayerOps (lab/conf/kernels)
    quant: Any = None  # QuantConfig (lab/conf/quant); None = unquantized
    kv_cache_dtype: str = "auto"  # cache.dtype: auto (the model's) | fp8
    # cache.hybrid: sliding-window layers get their own KV cache groups (lab/cache/groups.py)
    kv_hybrid: bool = True
    # lab/conf/logits_processors: factories (Hydra partials) called with a LogitsProcessorContext
    logits_processors: tuple[Any, ...] = ()
    # lab/conf/speculative: the proposer's option (plain data; {} or no _target_: off)
    speculative: Any = None
    knobs: EngineKnobs = field(default_factory=EngineKnobs)

    @property
    def parallel(self) -> ParallelConfig:
        """How the model is split over ranks (tensor_parallel_size, distributed_backend); world
        size 1: one worker, no process group."""
        return ParallelConfig(tensor_parallel_size=self.knobs.tensor_parallel_size,
                              backend=self.knobs.distributed_backend)
