"""`sim/step_time=roofline`: a step's time from the FLOPs it must do and the bytes it must move.

A step runs three phases one after the other, each bound by compute or by memory:

    linear     FLOPs 2 x active linear params x tokens (+ LM head x sampled requests and
               the drafts verified: a verification scores 1 + s rows);
               bytes: every dense weight once + the routed experts the step's tokens touch
               (expected min(E, tokens x top_k) per MoE layer)
    prefill    FLOPs of the chunks' causal query-key pairs in every layer;
               bytes: the keys the chunks read (their context and themselves) and write
    decode     FLOPs of the keys the decodes read in every layer;
               bytes: those keys read, one new token written per decode and layer

    t = overhead_s + sum over phases of max(FLOPs / (peak x flops_efficiency),
                                            bytes / (bandwidth x bandwidth_efficiency))

Sliding windows (ModelShape.layer_windows): a query at position i of a layer with window W reads
keys max(0, i - W + 1) .. i, so each layer's pairs and keys are counted with its own window,
whatever cache.hybrid does with the blocks (the backends apply the window either way):

    prefill chunk of q tokens after c   pairs  f(c + q) - f(c), f(n) = sum over k <= n of
                                               min(k, W) (q c + q (q + 1) / 2 without a window)
                                        keys   min(c, W - 1) of its context read, q read and
                                               written
    decode after c                      keys   min(c + 1, W) read, 1 written

A step's chunks are its StepShape.prefill_chunks. A shape without them (written by hand) is
taken as R equal chunks of q = P / R tokens whose context follows from the pairs: pairs =
R (q c + q (q + 1) / 2). Decodes: the shape keeps their number n and summed keys K (not each
context), so a window's layer reads n min(K / n, W) keys: exact when every decode is inside
the window or every one past it, an upper bound when they straddle it (min is concave).

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
        rows = shape.num_prefill_reqs + shape.num_decode_reqs + shape.num_draft_tokens
        flops = 2.0 * (m.active_linear_params * shape.num_tokens + m.lm_head_params * rows)
        dense, _ = m.linear_params()
        touched = min(m.n_routed_experts, shape.num_tokens * m.num_experts_per_tok)
        experts = m.num_moe_layers * touched * m.expert_params
        nbytes = ((dense + experts) * t.linear_bytes
                  + (m.lm_head_params + m.small_params()) * t.dtype_bytes)
        return flops, nbytes

    def prefill_attention(self, shape: StepShape) -> tuple[float, float]:
        tokens = shape.num_prefill_tokens
        chunks = prefill_chunks(shape)
        if not chunks:
            return 0.0, 0.0
        model = self.target.model
        flops = keys = 0.0
        for window, layers in model.window_layers().items():
            pairs = sum(windowed_pairs(q, c, window) for q, c in chunks)
            context = sum(c if window is None else min(c, window - 1) for _, c in chunks)
            flops += model.attention_flops(pairs, decode=False, layers=layers)
            keys += (context + 2 * tokens) * layers
        return flops, keys * self.target.kv_bytes_per_token_per_layer

    def decode_attention(self, shape: StepShape) -> tuple[float, float]:
        n, total = shape.num_decode_reqs, shape.decode_context_tokens
        if n == 0:
            return 0.0, 0.0
        model = self.target.model
        flops = keys = 0.0
        for window, layers in model.window_layers().items():
            read = total if window is None else n * min(total / n, window)
            flops += model.attention_flops(read, decode=True, layers=layers)
            keys += (read + n) * layers
        return flops, keys * self.target.kv_bytes_per_token_per_layer


def windowed_pairs(q: float, c: float, window: int | None) -> float:
    """Query-key pairs of a chunk of q queries after c computed tokens in a layer whose query at
    position i reads keys max(0, i - window + 1) .. i (every earlier one when window is None)."""
    return _keys_up_to(c + q, window) - _keys_up_to(c, window)


def _keys_up_to(n: float, window: int | None) -> float:
    """Keys the first n queries of a sequence read: sum over k = 1 .. n of min(k, window)."""
    if window is None or n <= window:
        return n * (n + 1) / 2
    return window * (window + 1) / 2 + (n - window) * window


def prefill_chunks(shape: StepShape) -> list[tuple[float, float]]:
    """(q, c) of each prefill chunk: the shape's, or for a shape without them, R equal chunks
    whose context follows from the step's pairs (module docstring)."""
    if shape.prefill_chunks or shape.num_prefill_reqs == 0:
        return [(float(q), float(c)) for q, c in shape.prefill_chunks]
    r = shape.num_prefill_reqs
    q = shape.num_prefill_tokens / r
    context = max(shape.prefill_attention_pairs / r - q * (q + 1) / 2, 0.0) / q
    return [(q, context)] * r
