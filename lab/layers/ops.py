"""The `kernels` config group: which implementation the model's norm, rotary, activation and MoE use.

The quantized GEMMs of lab/quant (int8 / fp8 W8A8, int4 weight-only) go through the same
object, so `kernels=torch` runs each method on its PyTorch reference and `kernels=triton` on
its Triton kernel; a quant method never picks an implementation itself.

A `LayerOps` is built once (Hydra: `conf/kernels/*.yaml`) and handed to the model, whose
RMSNorm / RotaryEmbedding / SiluAndMul layers hold a reference to it (no globals):

    torch   TorchOps   PyTorch math, HF's numerics step by step (runs anywhere, bf16 included)
    triton  TritonOps  the Triton kernels of lab/kernels (CUDA; on CPU: interpreter, fp32/fp16)
    auto    auto_ops   TritonOps when the run's device is CUDA, else TorchOps

Both produce HF's roundings (see each kernel's docstring), so switching keeps parity.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class LayerOps:
    """Base of the `kernels` group: the three memory-bound ops of a Llama-style layer."""

    name = "base"

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """RMSNorm of x [..., N] in fp32, cast back to x's dtype, times weight [N]. With
        `residual`: h = x + residual (in x's dtype) and returns (rms_norm(h), h)."""
        raise NotImplementedError

    def rotary(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
        sin: torch.Tensor, is_neox: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q [T, H, D], k [T, Hkv, D] at positions [T] with fp32 tables cos/sin
        [max_pos, rotary_dim/2]; neox = rotate halves, else interleaved pairs. Returns new (q, k)."""
        raise NotImplementedError

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., 2N] laid out | gate | up | -> silu(gate) * up [..., N]."""
        raise NotImplementedError

    def fused_moe(
        self, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
        topk_ids: torch.Tensor, w13_scale: torch.Tensor | None = None,
        w2_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Routed experts of a MoE layer: x [T, hidden], w13 [E, 2I, hidden] (| gate | up |),
        w2 [E, hidden, I], topk_weights / topk_ids [T, k] -> [T, hidden] in x's dtype,
        out[t] = sum_j topk_weights[t, j] * w2[e] (silu(gate) * up),  e = topk_ids[t, j].
        With scales ([E, 2I], [E, hidden] fp32) the weights are 8-bit per-channel quantized."""
        raise NotImplementedError

    def copy_blocks(
        self, src: torch.Tensor, dst: torch.Tensor, src_ids: torch.Tensor, dst_ids: torch.Tensor,
        block_dim: int,
    ) -> None:
        """Copy whole KV blocks src[.., src_ids[i], ..] -> dst[.., dst_ids[i], ..] along
        `block_dim` (same device; used to swap blocks through a staging buffer)."""
        raise NotImplementedError

    # ---- quantized GEMMs (the `quant` group's methods call these; see lab/quant) ----------
    def quantize_int8_per_token(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [M, K] -> (int8 [M, K], fp32 scale [M, 1]) with x ~= q * scale (symmetric)."""
        raise NotImplementedError

    def int8_gemm(
        self, a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
        bias: torch.Tensor | None, out_dtype: torch.dtype,
    ) -> torch.Tensor:
        """W8A8: (a_q [M, K] * a_scale [M, 1]) @ (w_q [N, K] * w_scale [N])^T + bias -> [M, N]."""
        raise NotImplementedError

    def quantize_fp8(
        self, x: torch.Tensor, per_token: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [M, K] -> (e4m3 [M, K], fp32 scale [M, 1] per token, or [1] per tensor)."""
        raise NotImplementedError

    def fp8_gemm(
        self, a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
        bias: torch.Tensor | None, out_dtype: torch.dtype,
    ) -> torch.Tensor:
        """W8A8 in e4m3: (a_q * a_scale) @ (w_q [N, K] * w_scale)^T + bias -> [M, N]."""
        raise NotImplementedError

    def w4a16_gemm(
        self, x: torch.Tensor, w_packed: torch.Tensor, scales: torch.Tensor,
        zeros: torch.Tensor | None, group_size: int, bias: torch.Tensor | None,
    ) -> torch.Tensor:
        """x [M, K] @ dequant(w_packed uint8 [N, K/2], scales/zeros [N, K/G])^T + bias -> [M, N]
        in x's dtype (int4 weights, two per byte; zeros None = symmetric)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def rotate_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D]; cos/sin [T, rotary_dim] (duplicated halves). HF's rotate_half math."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    x1, x2 = x_rot.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    out = x_rot * cos[:, None, :] + rotated * sin[:, None, :]
    return torch.cat((out, x_pass), dim=-1) if x_pass.numel() else out


def rotate_gptj(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D]; cos/sin [T, rotary_dim] (each angle repeated twice). Interleaved pairs."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    rotated = torch.stack((-x_rot[..., 1::2], x_rot[..., 0::2]), dim=-1).flatten(-2)
    out = x_rot * cos[:, None, :] + rotated * sin[:, None, :]
    return torch.cat((out, x_pass), dim=-1) if x_pass.numel() else out


class TorchOps(LayerOps):
    """PyTorch math (the layers' original implementation)."""

    name = "torch"

    def rms_norm(self, x, weight, eps, residual=None):
        if residual is not None:
            h = x + residual
            return self.rms_norm(h, weight, eps), h
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return weight * xf.to(x.dtype)  # HF order: cast back first, then scale

    def rotary(self, positions, q, k, cos, sin, is_neox=True):
        c, s = cos[positions].to(q.dtype), sin[positions].to(q.dtype)  # HF casts cos/sin first
        if is_neox:
            c, s = torch.cat((c, c), dim=-1), torch.cat((s, s), dim=-1)
            return rotate_neox(q, c, s), rotate_neox(k, c, s)
        c, s = c.repeat_interleave(2, dim=-1), s.repeat_interleave(2, dim=-1)
        return rotate_gptj(q, c, s), rotate_gptj(k, c, s)

    def silu_and_mul(self, x):
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    def fused_moe(self, x, w13, w2, topk_weights, topk_ids, w13_scale=None, w2_scale=None):
        from lab.kernels.fused_moe import fused_moe_ref

        return fused_moe_ref(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale)

    def copy_blocks(self, src, dst, src_ids, dst_ids, block_dim):
        from lab.kernels.copy_blocks import copy_blocks_ref

        copy_blocks_ref(src, dst, src_ids, dst_ids, block_dim)

    def quantize_int8_per_token(self, x):
        from lab.kernels.quantize import quantize_int8_per_token_ref

        return quantize_int8_per_token_ref(x)

    def int8_gemm(self, a_q, a_scale, w_q, w_scale, bias, out_dtype):
        from lab.kernels.int8_gemm import int8_gemm_ref

        return int8_gemm_ref(a_q, a_scale, w_q, w_scale, bias, out_dtype)

    def quantize_fp8(self, x, per_token):
        from lab.kernels import quantize

        fn = quantize.quantize_fp8_per_token_ref if per_token else quantize.quantize_fp8_per_tensor_ref
        return fn(x)

    def fp8_gemm(self, a_q, a_scale, w_q, w_scale, bias, out_dtype):
        from lab.kernels.fp8_gemm import fp8_gemm_ref

        return fp8_gemm_ref(a_q, a_scale, w_q, w_scale, bias, out_dtype)

    def w4a16_gemm(self, x, w_packed, scales, zeros, group_size, bias):
        from lab.kernels.w4a16_gemm import w4a16_gemm_ref

        return w4a16_gemm_ref(x, w_packed, scales, zeros, group_size, bias)


class TritonOps(LayerOps):
    """The Triton kernels. Importing them switches Triton to its interpreter when there is no
    CUDA; bf16 there raises ValueError (the interpreter has no bf16 arithmetic)."""

    name = "triton"

    def __init__(self) -> None:
        from lab.kernels import check_dtype_supported
        from lab.kernels.rmsnorm import rms_norm
        from lab.kernels.rotary import rotary_embedding
        from lab.kernels.silu_and_mul import silu_and_mul

        self._check = check_dtype_supported
        self._rms_norm, self._rotary, self._silu_and_mul = rms_norm, rotary_embedding, silu_and_mul

    def rms_norm(self, x, weight, eps, residual=None):
        self._check(x, "rms_norm input")
        return self._rms_norm(x, weight, eps, residual)

    def rotary(self, positions, q, k, cos, sin, is_neox=True):
        self._check(q, "rotary q")
        return self._rotary(positions, q, k, cos, sin, is_neox)

    def silu_and_mul(self, x):
        self._check(x, "silu_and_mul input")
        return self._silu_and_mul(x)

    def fused_moe(self, x, w13, w2, topk_weights, topk_ids, w13_scale=None, w2_scale=None):
        from lab.kernels.fused_moe import fused_moe

        self._check(x, "fused_moe input")
        return fused_moe(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale)

    def copy_blocks(self, src, dst, src_ids, dst_ids, block_dim):
        from lab.kernels.copy_blocks import copy_blocks  # bit-exact for every dtype

        copy_blocks(src, dst, src_ids, dst_ids, block_dim)

    def quantize_int8_per_token(self, x):
        from lab.kernels.quantize import quantize_int8_per_token

        return quantize_int8_per_token(x)

    def int8_gemm(self, a_q, a_scale, w_q, w_scale, bias, out_dtype):
        from lab.kernels.int8_gemm import int8_gemm

        return int8_gemm(a_q, a_scale, w_q, w_scale, bias, out_dtype)

    def quantize_fp8(self, x, per_token):
        from lab.kernels import quantize

        return (quantize.quantize_fp8_per_token if per_token else quantize.quantize_fp8_per_tensor)(x)

    def fp8_gemm(self, a_q, a_scale, w_q, w_scale, bias, out_dtype):
        if not a_q.is_cuda:
            raise ValueError("the fp8 Triton GEMM needs a CUDA device (e4m3 dots do not run in "
                             "Triton's interpreter); use kernels=torch on the CPU")
        from lab.kernels.fp8_gemm import fp8_gemm

        return fp8_gemm(a_q, a_scale, w_q, w_scale, bias, out_dtype)

    def w4a16_gemm(self, x, w_packed, scales, zeros, group_size, bias):
        from lab.kernels.w4a16_gemm import w4a16_gemm

        self._check(x, "w4a16_gemm input")
        return w4a16_gemm(x, w_packed, scales, zeros, group_size, bias)


def auto_ops(device: str = "auto") -> LayerOps:
    """TritonOps when the run's device is CUDA (`auto`: when CUDA is available), else TorchOps."""
    device = str(device)
    cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
    return TritonOps() if cuda else TorchOps()
