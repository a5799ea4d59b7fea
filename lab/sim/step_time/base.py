"""StepTimeModel: the base class of the `sim/step_time` group, and SimTarget, what a model binds to.

The simulator (`executor=sim`, lab/executor/sim.py) asks its step-time model for the duration of
every step from the step's `StepShape` (tokens, prefill chunks, decodes, attention pairs, decode
context, swapped blocks) and advances its virtual clock by it. Hydra builds the model from
lab/conf/sim/step_time/*.yaml without knowing the model or the device; the executor then calls
`bind(target)`, which returns a model ready to predict (a new object: the one Hydra built is
never changed).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from lab.core.step import StepShape
from lab.sim.device import DeviceSpec
from lab.sim.model_shape import ModelShape


@dataclass(frozen=True)
class SimTarget:
    """The simulated model on the simulated device, with the byte widths the run uses."""

    model: ModelShape
    device: DeviceSpec
    dtype_bytes: float  # weights and activations (4 for fp32, 2 for bf16)
    linear_bytes: float  # linear-layer weights (quantized: 1 for fp8/int8, 0.5 for w4a16)
    kv_dtype_bytes: float  # KV-cache elements (1 for cache.dtype=fp8)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token(self.kv_dtype_bytes)

    @property
    def weight_bytes(self) -> int:
        return self.model.weight_bytes(self.dtype_bytes, self.linear_bytes)


class StepTimeModel(ABC):
    """Predicts the seconds one engine step takes on the simulated device."""

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
