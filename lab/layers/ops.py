"""The `kernels` config group: which implementation the model's norm, rotary, activation and MoE use.

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
        topk_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Routed experts of a MoE layer: x [T, hidden], w13 [E, 2I, hidden] (| gate | up |),
        w2 [E, hidden, I], topk_weights / topk_ids [T, k] -> [T, hidden] in x's dtype,
        out[t] = sum_j topk_weights[t, j] * w2[e] (silu(gate) * up),  e = topk_ids[t, j]."""
        raise NotImplementedError

    def copy_blocks(
        self, src: torch.Tensor, dst: torch.Tensor, src_ids: torch.Tensor, dst_ids: torch.Tensor,
        block_dim: int,
    ) -> None:
        """Copy whole KV blocks src[.., src_ids[i], ..] -> dst[.., dst_ids[i], ..] along
        `block_dim` (same device; used to swap blocks through a staging buffer)."""
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

    def fused_moe(self, x, w13, w2, topk_weights, topk_ids):
        from lab.kernels.fused_moe import fused_moe_ref

        return fused_moe_ref(x, w13, w2, topk_weights, topk_ids)

    def copy_blocks(self, src, dst, src_ids, dst_ids, block_dim):
        from lab.kernels.copy_blocks import copy_blocks_ref

        copy_blocks_ref(src, dst, src_ids, dst_ids, block_dim)


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

    def fused_moe(self, x, w13, w2, topk_weights, topk_ids):
        from lab.kernels.fused_moe import fused_moe

        self._check(x, "fused_moe input")
        return fused_moe(x, w13, w2, topk_weights, topk_ids)

    def copy_blocks(self, src, dst, src_ids, dst_ids, block_dim):
        from lab.kernels.copy_blocks import copy_blocks  # bit-exact for every dtype

        copy_blocks(src, dst, src_ids, dst_ids, block_dim)


def auto_ops(device: str = "auto") -> LayerOps:
    """TritonOps when the run's device is CUDA (`auto`: when CUDA is available), else TorchOps."""
    device = str(device)
    cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
    return TritonOps() if cuda else TorchOps()
