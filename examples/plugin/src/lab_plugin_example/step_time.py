"""A step-time model for the simulator (the `sim/step_time` group; base class
lab.sim.step_time.base.StepTimeModel): linear in the step's shape.

    t = overhead_s + prefill_token_s * prefill tokens + decode_s * decodes
        + context_token_s * keys the decodes read
"""

from __future__ import annotations

from lab.core.step import StepShape
from lab.sim.step_time.base import StepTimeModel


class LinearStepTime(StepTimeModel):
    """Seconds of a step as a linear function of its shape (coefficients in seconds)."""

    def __init__(self, overhead_s: float = 0.002, prefill_token_s: float = 1e-5,
                 decode_s: float = 1e-4, context_token_s: float = 1e-7) -> None:
        coefs = dict(overhead_s=overhead_s, prefill_token_s=prefill_token_s,
                     decode_s=decode_s, context_token_s=context_token_s)
        bad = {k: v for k, v in coefs.items() if v < 0}
        if bad:
            raise ValueError(f"sim.step_time: {bad} must be >= 0 (seconds)")
        self.overhead_s, self.prefill_token_s = overhead_s, prefill_token_s
        self.decode_s, self.context_token_s = decode_s, context_token_s

    def predict(self, shape: StepShape) -> float:
        return (self.overhead_s + self.prefill_token_s * shape.num_prefill_tokens
                + self.decode_s * shape.num_decode_reqs
                + self.context_token_s * shape.decode_context_tokens)
