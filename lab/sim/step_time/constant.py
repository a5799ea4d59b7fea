"""`sim/step_time=constant`: every step costs the same, plus an optional cost per token."""

from __future__ import annotations

from lab.core.step import StepShape
from lab.sim.step_time.base import StepTimeModel


class ConstantStepTime(StepTimeModel):
    """t = seconds + per_token x num_tokens (a scheduling study where step cost is not the
    question, or the engine-overhead benchmark with seconds=0)."""

    def __init__(self, seconds: float = 0.01, per_token: float = 0.0) -> None:
        if seconds < 0 or per_token < 0:
            raise ValueError(f"sim.step_time: seconds={seconds} and per_token={per_token} "
                             "must be >= 0")
        self.seconds, self.per_token = float(seconds), float(per_token)

    def predict(self, shape: StepShape) -> float:
        return self.seconds + self.per_token * shape.num_tokens

    def describe(self) -> str:
        return f"constant ({self.seconds} s per step + {self.per_token} s per token)"
