"""KV-cache write: scatter the step's new K/V rows into the paged cache (Triton + PyTorch reference).

Cache layout per layer: `k_cache`, `v_cache` are each (num_blocks, block_size, Hkv, D); token t goes
to block slot // block_size, offset slot % block_size. Slots < 0 (padding) are skipped, so padded
tokens never touch the cache. Values are cast to the cache dtype on store.

Grid (cdiv(T, BLOCK_T), cdiv(Hkv, BLOCK_H)): one program copies BLOCK_T tokens x BLOCK_H heads x D
for both K and V. The copy is memory-bound; a tile of up to `_MAX_TILE` elements gives wide,
coalesced accesses (kernel-targets §3.5: vLLM's reshape_and_cache_flash uses one program per
token x tile, i.e. BLOCK_T = 1 when a token's heads fill the tile).
On GPU the cast rounds to nearest-even like torch's `.to`; the interpreter truncates fp32 -> bf16
(1 ulp off), so bit-exact tests use fp32/fp16 caches on CPU.

fp8 cache (float8 e4m3fn, `cache.dtype=fp8`; scheme in lab/kernels/fp8_kv.py): with k_scale /
v_scale (fp32 [1] device tensors; None means 1.0) the store is fp8(clamp(x / scale, +-448)),
an IEEE division (`div_rn`) and round-to-nearest-even, bit-identical to `quantize_kv_ref`. The
rounding to e4m3 is done in fp32 first (`_round_to_e4m3` of lab/kernels/quantize.py) because the
interpreter's fp32 -> fp8 conversion is wrong when the rounding carries into the exponent; so
this runs on the CPU too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lab.kernels import interpreter_active, num_warps_for
from lab.kernels.fp8_kv import FP8_KV_DTYPE, quantize_kv_ref
from lab.kernels.quantize import _round_to_e4m3

_MAX_TILE = 2048  # elements per program (BLOCK_H * D); 4 KiB of bf16 per K and per V


@triton.jit
def _kv_cache_write_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, k_scale_ptr, v_scale_ptr,
    num_tokens, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_co, stride_ch,
    num_kv_heads,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_T: tl.constexpr,
    FP8: tl.constexpr,
):
    """Copy K/V rows [t0, t0 + BLOCK_T) x heads [h0, h0 + BLOCK_H) into their cache slots.

    A tile is BLOCK_T tokens x (BLOCK_H * HEAD_DIM) elements: column c is head c // HEAD_DIM,
    dim c % HEAD_DIM. Inputs and caches have unit stride along D (asserted on the host).
    """
    toks = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    slots = tl.load(slot_ptr + toks, mask=toks < num_tokens, other=-1).to(tl.int64)
    cols = tl.arange(0, BLOCK_H * HEAD_DIM)
    heads = tl.program_id(1) * BLOCK_H + cols // HEAD_DIM
    dims = cols % HEAD_DIM
    mask = (slots >= 0)[:, None] & (heads < num_kv_heads)[None, :]  # slot -1: padding
    src_k = k_ptr + toks[:, None] * stride_kt + (heads * stride_kh + dims)[None, :]
    src_v = v_ptr + toks[:, None] * stride_vt + (heads * stride_vh + dims)[None, :]
    blk, off = slots // BLOCK_SIZE, slots % BLOCK_SIZE
    dst = (blk * stride_cb + off * stride_co)[:, None] + (heads * stride_ch + dims)[None, :]
    k = tl.load(src_k, mask=mask)
    v = tl.load(src_v, mask=mask)
    if FP8:
        k = _to_fp8_grid(k, tl.load(k_scale_ptr))
        v = _to_fp8_grid(v, tl.load(v_scale_ptr))
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _to_fp8_grid(x, scale):
    """x / scale clamped to +-448 and rounded to an e4m3 value (still fp32): the store converts."""
    y = tl.math.div_rn(x.to(tl.float32), scale)
    return _round_to_e4m3(tl.minimum(tl.maximum(y, -448.0), 448.0))  # e4m3fn max


def _scale_arg(scale, ref: torch.Tensor) -> torch.Tensor:
    """An fp8 scale argument as an fp32 [1] tensor on ref's device (None: 1.0)."""
    if scale is None:
        scale = 1.0
    if not isinstance(scale, torch.Tensor):
        return torch.tensor([float(scale)], dtype=torch.float32, device=ref.device)
    assert scale.numel() == 1 and scale.dtype == torch.float32, (scale.shape, scale.dtype)
    return scale


def _check_args(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Shape/layout checks shared by the kernel wrapper (cheap, host-side, no sync)."""
    t, h, d = k.shape
    assert v.shape == k.shape, (v.shape, k.shape)
    assert k_cache.shape == v_cache.shape and k_cache.dim() == 4, (k_cache.shape, v_cache.shape)
    assert k_cache.shape[2:] == (h, d), (k_cache.shape, k.shape)
    assert k_cache.stride() == v_cache.stride(), "K and V caches must share one layout"
    assert slot_mapping.shape == (t,), (slot_mapping.shape, t)
    assert d >= 1 and d & (d - 1) == 0, f"head_dim must be a power of two, got {d}"
    for x in (k, v, k_cache, v_cache):
        assert x.stride(-1) == 1, "last (head_dim) dimension must be contiguous"


def write_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
) -> None:
    """Write k[t], v[t] (each [T, Hkv, D]) at slot_mapping[t] of k_cache / v_cache; skip slots < 0.
    An fp8 cache stores x / scale (k_scale, v_scale: fp32 [1]; ignored for other caches)."""
    _check_args(k, v, k_cache, v_cache, slot_mapping)
    t, h, d = k.shape
    if t == 0:
        return
    fp8 = k_cache.dtype == FP8_KV_DTYPE
    if fp8:
        k_scale, v_scale = _scale_arg(k_scale, k), _scale_arg(v_scale, k)
    else:
        k_scale = v_scale = slot_mapping  # unused pointers
    block_h = min(triton.next_power_of_2(h), max(1, _MAX_TILE // d))
    block_t = _tokens_per_program(block_h * d)
    grid = (triton.cdiv(t, block_t), triton.cdiv(h, block_h))
    _kv_cache_write_kernel[grid](
        k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale,
        t, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        h,
        BLOCK_SIZE=k_cache.shape[1],
        HEAD_DIM=d,
        BLOCK_H=block_h,
        BLOCK_T=block_t,
        FP8=fp8,
        num_warps=num_warps_for(block_t * block_h * d),
    )


def _tokens_per_program(row_elems: int) -> int:
    """Tokens per program: fill a tile of _MAX_TILE elements on a GPU; in the interpreter, whose
    cost is per program and per op rather than per element, take many tokens at once."""
    if interpreter_active():
        return 64
    return max(1, _MAX_TILE // row_elems)


def write_kv_cache_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
) -> None:
    """PyTorch reference of `write_kv_cache` (same signature and semantics)."""
    num_blocks, block_size, h, d = k_cache.shape
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    blk, off = slots // block_size, slots % block_size
    if k_cache.dtype == FP8_KV_DTYPE:
        k_cache[blk, off] = quantize_kv_ref(k[valid], _scale_arg(k_scale, k))
        v_cache[blk, off] = quantize_kv_ref(v[valid], _scale_arg(v_scale, k))
        return
    k_cache[blk, off] = k[valid].to(k_cache.dtype)
    v_cache[blk, off] = v[valid].to(v_cache.dtype)
