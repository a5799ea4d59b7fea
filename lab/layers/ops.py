"""The `kernels` config group: which implementation the model's norm, rotary, activation, MoE,
dense linears, the sampler's argmax and speculative decoding's rejection sampler use.

The quantized GEMMs of lab/quant (int8 / fp8 W8A8, int4 weight-only) go through the same
object, so `kernels=torch` runs each method on its PyTorch reference and `kernels=triton` on
its Triton kernel; a quant method never picks an implementation itself.

Every Triton-backed op is one row of `OPS`: its name, its contract, and where its two
implementations live (each Triton kernel sits beside its PyTorch reference in
lab/kernels/*.py). A `LayerOps` binds one column of that table to its attributes; it is built
once (Hydra: `lab/conf/kernels/*.yaml`) and handed to the model, whose RMSNorm /
RotaryEmbedding / SiluAndMul layers hold a reference to it (no globals). Beside the table, three
hooks, PyTorch references here, which the C++ CPU option overrides:

    setup(device, dtype)   build or load what the ops need; the Worker calls it before the model
                           loads, so no kernel is built inside a request (references: nothing)
    pack_linear(weight)    (kernel, packed weight) for a dense linear after loading, or
                           (None, None): F.linear (lab/layers/linear.py)
    argmax_rows(x)         the sampler's greedy pick: `x.max(dim=-1).indices`

The options:

    torch   TorchOps   the `*_ref` functions: HF's numerics step by step (anywhere, bf16
                       included), F.linear, torch's argmax: no packing, nothing built
    triton  TritonOps  the Triton kernels of lab/kernels (CUDA; on CPU: interpreter, fp32/fp16);
                       linears and argmax as torch
    cpu     CPUOps     lab/layers/cpu_ops.py: the torch references for the table, and on a CPU
                       lab's C++ GEMMs / argmax and oneDNN-prepacked weights
    auto    auto_ops   TritonOps when the run's device is CUDA, else its `cpu` option (kernels=cpu
                       that falls back to a kernel's reference where the kernel cannot be built)

All produce HF's roundings for the table's ops (see each kernel's docstring), so switching keeps
parity; the C++ GEMMs sum in their own order (lab/kernels/cpu_gemm.py, cpu_sgemm.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from lab.kernels.cpu_argmax import argmax_rows_ref

IMPLS = ("torch", "triton")


@dataclass(frozen=True)
class Op:
    """One op of the `kernels` group: `module:function` of its PyTorch reference and of its
    Triton implementation (same signature), and its contract."""

    name: str
    reference: str
    triton: str
    doc: str

    def target(self, impl: str) -> str:
        """The `module:function` implementing this op for `impl` ("torch" or "triton")."""
        if impl not in IMPLS:
            raise ValueError(f"kernels impl {impl!r} is invalid: use one of {', '.join(IMPLS)}")
        return self.reference if impl == "torch" else self.triton


def _op(name: str, module: str, kernel: str, doc: str) -> Op:
    """A row whose reference is `<kernel>_ref` beside `kernel` in lab/kernels/<module>.py."""
    path = f"lab.kernels.{module}:{kernel}"
    return Op(name, f"{path}_ref", path, doc)


OPS: tuple[Op, ...] = (
    _op("rms_norm", "rmsnorm", "rms_norm", """(x, weight, eps, residual=None): RMSNorm of
        x [..., N] in fp32, cast back to x's dtype, times weight [N]. With `residual`:
        h = x + residual (in x's dtype) and returns (rms_norm(h), h)."""),
    _op("rotary", "rotary", "rotary_embedding", """(positions, q, k, cos, sin, is_neox=True):
        rotate q [T, H, D], k [T, Hkv, D] at positions [T] with fp32 tables cos/sin
        [max_pos, rotary_dim/2]; neox = rotate halves, else interleaved pairs. Returns new (q, k)."""),
    _op("silu_and_mul", "silu_and_mul", "silu_and_mul", """(x): x [..., 2N] laid out
        | gate | up | -> silu(gate) * up [..., N]."""),
    _op("fused_moe", "fused_moe", "fused_moe", """(x, w13, w2, topk_weights, topk_ids,
        w13_scale=None, w2_scale=None): routed experts of a MoE layer: x [T, hidden],
        w13 [E, 2I, hidden] (| gate | up |), w2 [E, hidden, I], topk_weights / topk_ids [T, k]
        -> [T, hidden] in x's dtype, out[t] = sum_j topk_weights[t, j] * w2[e] (silu(gate) * up),
        e = topk_ids[t, j]. With scales ([E, 2I], [E, hidden] fp32) the weights are 8-bit
        per-channel quantized."""),
    _op("copy_blocks", "copy_blocks", "copy_blocks", """(src, dst, src_ids, dst_ids, block_dim):
        copy whole KV blocks src[.., src_ids[i], ..] -> dst[.., dst_ids[i], ..] along `block_dim`
        (same device, bit-exact for every dtype; used to swap blocks through a staging buffer)."""),
    Op("rejection_sample", "lab.kernels.rejection:rejection_sample_ref",
       "lab.kernels.rejection:rejection_sample_triton", """(draft_token_ids,
        num_draft_tokens, target_probs, draft_probs, is_greedy, noise): speculative decoding's
        rejection sampler over a flat batch (lab/sampling/rejection.py: the rule, the layout,
        `draw_noise`): drafts [D], per-request counts [B], fp32 target rows [D + B, V], draft
        rows [D, V] or None (point masses), bool [B] -> int64 [B, max k + 1], the emitted
        tokens then -1; both implementations emit the same tokens from the same noise."""),
    # ---- quantized GEMMs (the `quant` group's methods call these; see lab/quant) ------------
    _op("quantize_int8_per_token", "quantize", "quantize_int8_per_token", """(x): x [M, K] ->
        (int8 [M, K], fp32 scale [M, 1]) with x ~= q * scale (symmetric)."""),
    _op("int8_gemm", "int8_gemm", "int8_gemm", """(a_q, a_scale, w_q, w_scale, bias, out_dtype):
        W8A8: (a_q [M, K] * a_scale [M, 1]) @ (w_q [N, K] * w_scale [N])^T + bias -> [M, N]."""),
    _op("quantize_fp8", "quantize", "quantize_fp8", """(x, per_token): x [M, K] ->
        (e4m3 [M, K], fp32 scale [M, 1] per token, or [1] per tensor)."""),
    _op("fp8_gemm", "fp8_gemm", "fp8_gemm", """(a_q, a_scale, w_q, w_scale, bias, out_dtype):
        W8A8 in e4m3: (a_q * a_scale) @ (w_q [N, K] * w_scale)^T + bias -> [M, N]. The Triton
        kernel needs CUDA (e4m3 dots do not run in Triton's interpreter)."""),
    _op("w4a16_gemm", "w4a16_gemm", "w4a16_gemm", """(x, w_packed, scales, zeros, group_size,
        bias): x [M, K] @ dequant(w_packed uint8 [N, K/2], scales/zeros [N, K/G])^T + bias
        -> [M, N] in x's dtype (int4 weights, two per byte; zeros None = symmetric)."""),
)


class LazyImpl:
    """An op's implementation, imported on its first call (the kernel modules import Triton)."""

    def __init__(self, op: Op, impl: str) -> None:
        self.op, self.path = op, op.target(impl)
        self.__doc__ = op.doc
        self._fn: Callable[..., Any] | None = None

    def resolve(self) -> Callable[..., Any]:
        """The implementing function (imported now if it was not yet)."""
        if self._fn is None:
            module, name = self.path.split(":")
            self._fn = getattr(importlib.import_module(module), name)
        return self._fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<{self.op.name}: {self.path}>"


class LayerOps:
    """Base of the `kernels` group: the ops of `OPS`, bound to one implementation ("torch" or
    "triton") as attributes of the same names (contracts: `OPS[i].doc`)."""

    rms_norm: Callable[..., torch.Tensor | tuple[torch.Tensor, torch.Tensor]]
    rotary: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    silu_and_mul: Callable[..., torch.Tensor]
    fused_moe: Callable[..., torch.Tensor]
    copy_blocks: Callable[..., None]
    rejection_sample: Callable[..., torch.Tensor]
    quantize_int8_per_token: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    int8_gemm: Callable[..., torch.Tensor]
    quantize_fp8: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    fp8_gemm: Callable[..., torch.Tensor]
    w4a16_gemm: Callable[..., torch.Tensor]

    def __init__(self, impl: str) -> None:
        self.name = impl
        self.uses_triton = impl == "triton"  # its ops launch Triton kernels
        for op in OPS:
            setattr(self, op.name, LazyImpl(op, impl))

    def setup(self, device: torch.device, dtype: torch.dtype) -> None:
        """Build or load what these ops need to run a `dtype` model on `device`, before the model
        loads (the Worker calls it; nothing here: the references need nothing)."""

    def pack_linear(self, weight: torch.Tensor) -> tuple[Any, torch.Tensor | None]:
        """(kernel, packed weight) for a dense linear's loaded weight [out, in], or (None, None)
        for F.linear (the reference, here). A kernel has `gemm(x, packed, weight, bias)`."""
        return None, None

    def argmax_rows(self, x: torch.Tensor) -> torch.Tensor:
        """The first index of each row's largest value, a NaN counting as the largest (the
        sampler's greedy pick; the reference, here: torch's)."""
        return argmax_rows_ref(x)

    def resolve_all(self) -> None:
        """Import every op's implementation now (torch.compile cannot trace the lazy import of
        a first call; lab/compile resolves them before tracing)."""
        for op in OPS:
            getattr(self, op.name).resolve()

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class TorchOps(LayerOps):
    """The PyTorch references (`kernels=torch`)."""

    def __init__(self) -> None:
        super().__init__("torch")


class TritonOps(LayerOps):
    """The Triton kernels (`kernels=triton`). Without CUDA they run in Triton's interpreter (the
    run switches it on: lab.kernels.use_interpreter_without_cuda); bf16 there raises ValueError
    (the interpreter has no bf16 arithmetic)."""

    def __init__(self) -> None:
        super().__init__("triton")


def auto_ops(device: str = "auto", cpu: LayerOps | None = None) -> LayerOps:
    """TritonOps when the run's device is CUDA (`auto`: when CUDA is available), else `cpu` (the
    option lab/conf/kernels/auto.yaml gives: kernels=cpu with `fallback: true`; None: TorchOps)."""
    device = str(device)
    cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
    if cuda:
        return TritonOps()
    return cpu if cpu is not None else TorchOps()
