"""`sim/step_time=roofline`: a step's time from the FLOPs it must do and the bytes it must move.

A step runs three phases one after the other, each bound by compute or by memory:

    linear     FLOPs 2 x active linear params x tokens (+ LM head x sampled requests);
               bytes: every dense weight once + the routed experts the step's tokens touch
               (expected min(E, tokens x top_k) per MoE layer)
    prefill    FLOPs of the chunks' causal query-key pairs (StepShape.prefill_attention_pairs);
               bytes: the keys the chunks read (their context and themselves) and write
    decode     FLOPs of the decodes' keys (StepShape.decode_context_tokens);
               bytes: those keys read, one new token written per decode

    t = overhead_s + sum over phases of max(FLOPs / (peak x flops_efficiency),
                                            bytes / (bandwidth x bandwidth_efficiency))

Keys read by prefill chunks are estimated from the shape (which has no per-chunk context): with
P prefill tokens in R chunks of q = P / R tokens each, pairs = sum(q c) + R q (q + 1) / 2, so
sum(c) = (pairs - R q (q + 1) / 2) / q, and the chunks read sum(c) + P keys.

With tensor parallelism the bound target's model is one rank's shape (its heads, KV heads,
MLP and vocabulary slices, lab/sim/model_shape.py), so these are one rank's FLOPs and bytes;
the step's all-reduces are not in `predict`: the executor adds `SimTarget.comm_seconds`.
"""

from __future__ import annotations

from lab.core.step import StepShape
from lab.sim.step_time.base import SimTarget, StepTimeModel


class RooflineStepTime(StepTimeModel):
    """Roofline step time; `bind` gives it the model and the device."""

    def __init__(self, overhead_s: float = 0.002, flops_efficiency: float = 0.6,
                 bandwidth_efficiency: float = 0.8, target: SimTarget | None = None) -> None:
        for name, v in [("flops_efficiency", flops_efficiency),
                        ("bandwidth_efficiency", bandwidth_efficiency)]:
            if not 0 < v <= 1:
                raise ValueError(f"sim.step_time.{name}={v} must be in (0, 1]")
        if overhead_s < 0:
            raise ValueError(f"sim.step_time.overhead_s={overhead_s} must be >= 0")
        self.overhead_s = float(overhead_s)
        self.flops_efficiency = float(flops_efficiency)
        self.bandwidth_efficiency = float(bandwidth_efficiency)
        self.target = target

    def bind(self, target: SimTarget) -> RooflineStepTime:
        return RooflineStepTime(self.overhead_s, self.flops_efficiency,
                                self.bandwidth_efficiency, target)

    def predict(self, shape: StepShape) -> float:
        if self.target is None:
            raise RuntimeError("RooflineStepTime.predict before bind(target): the executor "
                               "binds it to the model and the device")
        if shape.num_tokens == 0:
            return self.overhead_s
        return self.overhead_s + sum(self._time(f, b) for f, b in self.phases(shape))

    def describe(self) -> str:
        source = f"; {self.target.device.source}" if self.target is not None else ""
        return (f"roofline (uncalibrated: data-sheet peaks x efficiencies "
                f"{self.flops_efficiency} / {self.bandwidth_efficiency}, "
                f"{self.overhead_s * 1e3:g} ms per step{source})")

    def _time(self, flops: float, nbytes: float) -> float:
        device = self.target.device
        return max(flops / (device.peak_flops * self.flops_efficiency),
                   nbytes / (device.mem_bandwidth * self.bandwidth_efficiency))

    def phases(self, shape: StepShape) -> list[tuple[float, float]]:
        """(FLOPs, bytes) of the linear, prefill-attention and decode-attention phases."""
        return [self.linear(shape), self.prefill_attention(shape), self.decode_attention(shape)]

    def linear(self, shape: StepShape) -> tuple[float, float]:
        t = self.target
        m = t.model
        sampled = shape.num_prefill_reqs + shape.num_decode_reqs
        flops = 2.0 * (m.active_linear_params * shape.num_tokens + m.lm_head_params * sampled)
        dense, _ = m.linear_params()
        touched = min(m.n_routed_experts, shape.num_tokens * m.num_experts_per_tok)
        experts = m.num_moe_layers * touched * m.expert_params
        nbytes = ((dense + experts) * t.linear_bytes
                  + (m.lm_head_params + m.small_params()) * t.dtype_bytes)
        return flops, nbytes

    def prefill_attention(self, shape: StepShape) -> tuple[float, float]:
        tokens, chunks = shape.num_prefill_tokens, shape.num_prefill_reqs
        if chunks == 0:
            return 0.0, 0.0
        q = tokens / chunks
        context = max(shape.prefill_attention_pairs - chunks * q * (q + 1) / 2, 0.0) / q
        flops = self.target.model.attention_flops(shape.prefill_attention_pairs, decode=False)
        return flops, (context + 2 * tokens) * self.target.kv_bytes_per_token

    def decode_attention(self, shape: StepShape) -> tuple[float, float]:
        keys = shape.decode_context_tokens
        flops = self.target.model.attention_flops(keys, decode=True)
        return flops, (keys + shape.num_decode_reqs) * self.target.kv_bytes_per_token
