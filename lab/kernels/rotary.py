"""Rotary position embedding for q and k in one launch (Triton + PyTorch reference).

cos/sin are the tables of `lab.layers.rotary.RotaryEmbedding`: [max_pos, rotary_dim/2] fp32, with
any rope scaling (yarn's attention factor too) already folded in. Pair i of a head is rotated by
angle i; the layout says where the pair lives (rotary_dim <= D; the tail passes through):

    neox (HF rotate_half):  | x1 = x[:R/2] | x2 = x[R/2:R] | pass |   pair i = (x1[i], x2[i])
    gptj (interleaved):     | x0 x1 | x2 x3 | ... | pass |            pair i = (x[2i], x[2i+1])

    out_a = a*cos - b*sin,  out_b = b*cos + a*sin

Rounding follows HF step by step: cos/sin are cast to the input dtype, each product and the sum
round to the input dtype (no-ops in fp32), so fp16/bf16 results match the PyTorch path. The
kernel is compiled without FP fusion: with it (Triton's default up to 3.9) LLVM narrows
`(a*cos).to(bf16)` to a bf16 multiply and then contracts `a*cos - bf16(b*sin)` into one
`fma.rn.bf16`, skipping the rounding of a*cos (seen in the sm_90 PTX of triton 3.6 and 3.9).

Not in place: returns new contiguous (q, k); inputs may be strided views (unit last stride), e.g.
slices of the fused qkv output. Grid (T,): one program per token rotates all q and k heads,
loading its cos/sin row once; heads go in tiles of BLOCK_H x BLOCK_R pairs (gptj rows are loaded
contiguously and split into pairs in registers, so both layouts get 128-bit accesses).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lab.kernels import check_dtype_supported, num_warps_for

_HEAD_TILE = 2048  # elements (heads x pairs) per tile
LAUNCH_OPTIONS = dict(enable_fp_fusion=False)  # no fma contraction (module docstring)


@triton.jit
def _rotate_pairs(a, b, cos, sin, dt: tl.constexpr):
    """(a*cos - b*sin, b*cos + a*sin) in fp32, each product and sum rounded to dt as HF does."""
    ac, bs = (a * cos).to(dt).to(tl.float32), (b * sin).to(dt).to(tl.float32)
    bc, as_ = (b * cos).to(dt).to(tl.float32), (a * sin).to(dt).to(tl.float32)
    return (ac - bs).to(dt), (bc + as_).to(dt)


@triton.jit
def _rotate_heads(
    src, dst, stride_src_h, n_heads, cos, sin, half,
    HEAD_DIM: tl.constexpr, IS_NEOX: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
):
    """Rotate heads [0, n_heads) of one token: src rows strided by stride_src_h, dst contiguous."""
    dt: tl.constexpr = dst.dtype.element_ty
    r = tl.arange(0, BLOCK_R)
    r2 = tl.arange(0, 2 * BLOCK_R)  # gptj: pairs are adjacent, load them as one contiguous row
    for h0 in range(0, n_heads, BLOCK_H):
        hs = h0 + tl.arange(0, BLOCK_H)
        s_row, d_row = (hs * stride_src_h)[:, None], (hs * HEAD_DIM)[:, None]
        if IS_NEOX:
            mask = (hs < n_heads)[:, None] & (r < half)[None, :]
            a = tl.load(src + s_row + r[None, :], mask=mask, other=0.0).to(tl.float32)
            b = tl.load(src + s_row + half + r[None, :], mask=mask, other=0.0).to(tl.float32)
            oa, ob = _rotate_pairs(a, b, cos, sin, dt)
            tl.store(dst + d_row + r[None, :], oa, mask=mask)
            tl.store(dst + d_row + half + r[None, :], ob, mask=mask)
        else:
            mask = (hs < n_heads)[:, None] & (r2 < 2 * half)[None, :]
            x = tl.load(src + s_row + r2[None, :], mask=mask, other=0.0).to(tl.float32)
            a, b = tl.split(tl.reshape(x, (BLOCK_H, BLOCK_R, 2)))
            oa, ob = _rotate_pairs(a, b, cos, sin, dt)
            out = tl.reshape(tl.join(oa, ob), (BLOCK_H, 2 * BLOCK_R))
            tl.store(dst + d_row + r2[None, :], out, mask=mask)
        if BLOCK_P > 0:  # pass-through tail [2*half, HEAD_DIM)
            p = 2 * half + tl.arange(0, BLOCK_P)
            pmask = (hs < n_heads)[:, None] & (p < HEAD_DIM)[None, :]
            tail = tl.load(src + s_row + p[None, :], mask=pmask, other=0.0)
            tl.store(dst + d_row + p[None, :], tail, mask=pmask)


@triton.jit
def _rotary_kernel(
    pos_ptr, q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cos, stride_sin,
    n_q_heads, n_kv_heads, half,
    HEAD_DIM: tl.constexpr, IS_NEOX: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
):
    """Token t = program_id(0): rotate its q and k heads by the angles of positions[t]."""
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    r = tl.arange(0, BLOCK_R)
    dt = qo_ptr.dtype.element_ty
    cos = tl.load(cos_ptr + pos * stride_cos + r, mask=r < half, other=0.0).to(dt).to(tl.float32)
    sin = tl.load(sin_ptr + pos * stride_sin + r, mask=r < half, other=0.0).to(dt).to(tl.float32)
    cos, sin = cos[None, :], sin[None, :]
    _rotate_heads(q_ptr + t * stride_qt, qo_ptr + t * n_q_heads * HEAD_DIM, stride_qh, n_q_heads,
                  cos, sin, half, HEAD_DIM, IS_NEOX, BLOCK_H, BLOCK_R, BLOCK_P)
    _rotate_heads(k_ptr + t * stride_kt, ko_ptr + t * n_kv_heads * HEAD_DIM, stride_kh, n_kv_heads,
                  cos, sin, half, HEAD_DIM, IS_NEOX, BLOCK_H, BLOCK_R, BLOCK_P)


def _check(positions, q, k, cos, sin) -> int:
    """Validate shapes; returns half = rotary_dim / 2."""
    if q.dim() != 3 or k.dim() != 3 or q.shape[-1] != k.shape[-1] or q.shape[0] != k.shape[0]:
        raise ValueError(f"expected q [T, H, D] and k [T, Hkv, D], got {tuple(q.shape)}, {tuple(k.shape)}")
    if q.dtype != k.dtype:
        raise ValueError(f"q and k dtypes differ ({q.dtype}, {k.dtype})")
    if positions.shape != (q.shape[0],):
        raise ValueError(f"positions shape {tuple(positions.shape)} != ({q.shape[0]},)")
    half = cos.shape[-1]
    if sin.shape != cos.shape or 2 * half > q.shape[-1]:
        raise ValueError(f"cos/sin {tuple(cos.shape)} do not fit head_dim {q.shape[-1]}")
    return half


def rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
    sin: torch.Tensor, is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, H, D] and k [T, Hkv, D] at positions [T] with tables cos/sin [max_pos, R/2].

    Returns new contiguous (q, k) in the input dtype; the inputs are not modified. Positions
    must lie in [0, max_pos) (not checked: no host sync).
    """
    check_dtype_supported(q, "rotary q")
    half = _check(positions, q, k, cos, sin)
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if q.shape[0] == 0:
        return q_out, k_out
    cos = cos if cos.stride(-1) == 1 else cos.contiguous()
    sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    head_dim = q.shape[-1]
    block_r = triton.next_power_of_2(half)
    block_h = min(triton.next_power_of_2(max(q.shape[1], k.shape[1])), max(1, _HEAD_TILE // block_r))
    tail = head_dim - 2 * half
    _rotary_kernel[(q.shape[0],)](
        positions, q, k, cos, sin, q_out, k_out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), sin.stride(0),
        q.shape[1], k.shape[1], half,
        HEAD_DIM=head_dim, IS_NEOX=is_neox, BLOCK_H=block_h, BLOCK_R=block_r,
        BLOCK_P=triton.next_power_of_2(tail) if tail else 0,
        num_warps=num_warps_for(2 * block_h * block_r),
        **LAUNCH_OPTIONS,
    )
    return q_out, k_out


def _rotate_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    """x [T, heads, D]; cos/sin [T, R/2] already in x's dtype.

    Each half (neox) or each element of a pair (interleaved) is computed from its own slice,
    x1*cos - x2*sin and x2*cos + x1*sin: the same products and sums as HF's
    x*cat(cos, cos) + rotate_half(x)*cat(sin, sin), bit for bit, but every operand is read
    contiguously, so inductor's C++ kernel (compile=true) loads cos/sin as vectors instead of
    gathering them one element at a time through `d % (R/2)` (faster on a CPU:
    experiments/results/2026-12-05-cpu-prefill-compile.md).
    """
    rot = 2 * cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    if is_neox:
        x1, x2 = x_rot.chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return torch.cat((out, x_pass), dim=-1) if x_pass.shape[-1] else out


def rotary_embedding_ref(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
    sin: torch.Tensor, is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch reference (HF apply_rotary_pos_emb; gptj: rotate_every_two)."""
    c, s = cos[positions].to(q.dtype), sin[positions].to(q.dtype)
    return _rotate_ref(q, c, s, is_neox), _rotate_ref(k, c, s, is_neox)
