"""Copy whole KV blocks between two caches of the same layout (Triton + PyTorch reference).

A layer's cache is viewed as (outer, num_blocks, inner): `outer` is the product of the dims before
the block dim (2 for split K/V, 1 for a latent cache), `inner` the elements of one block (its
dims after the block dim, contiguous). For every pair i:

    dst[o, dst_ids[i], :] = src[o, src_ids[i], :]      for o in 0 .. outer-1

Grid (num_pairs, outer, cdiv(inner, BLOCK)): each program moves one BLOCK-wide chunk of one block.
Elements are moved as same-width integers, so any dtype (bf16, fp8 included) copies bit-exactly,
in the interpreter as well. Both caches must be on one device: swapping to CPU memory gathers
device blocks into a contiguous staging buffer with this kernel, then moves it with one copy
(see lab/worker/swap.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lab.kernels import interpreter_active, num_warps_for

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@triton.jit
def _copy_blocks_kernel(
    src_ptr, dst_ptr, src_ids_ptr, dst_ids_ptr, inner,
    stride_src_outer, stride_src_block, stride_dst_outer, stride_dst_block,
    BLOCK: tl.constexpr,
):
    pair = tl.program_id(0)
    outer = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inner
    s = tl.load(src_ids_ptr + pair).to(tl.int64)
    d = tl.load(dst_ids_ptr + pair).to(tl.int64)
    x = tl.load(src_ptr + outer * stride_src_outer + s * stride_src_block + offs, mask=mask)
    tl.store(dst_ptr + outer * stride_dst_outer + d * stride_dst_block + offs, x, mask=mask)


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """The same bytes viewed as an integer dtype of the same width (copies stay bit-exact and
    work for dtypes that CPU indexing ops lack, such as fp8)."""
    return t.view(_BITS[t.element_size()])


def _as_blocks(cache: torch.Tensor, block_dim: int, name: str) -> torch.Tensor:
    """The cache as an integer (outer, num_blocks, inner) view (no copy)."""
    if not cache.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    outer = 1
    for size in cache.shape[:block_dim]:
        outer *= size
    return as_bits(cache).view(outer, cache.shape[block_dim], -1)


def _check(src, dst, src_ids, dst_ids, block_dim) -> None:
    if src.dtype != dst.dtype or src.device != dst.device:
        raise ValueError(f"src ({src.dtype}, {src.device}) and dst ({dst.dtype}, {dst.device}) "
                         "must share dtype and device")
    if src.dim() != dst.dim() or not 0 <= block_dim < src.dim():
        raise ValueError(f"block_dim={block_dim} is out of range for {src.dim()}-d caches")
    same = [i for i in range(src.dim()) if i != block_dim]
    if [src.shape[i] for i in same] != [dst.shape[i] for i in same]:
        raise ValueError(f"src {tuple(src.shape)} and dst {tuple(dst.shape)} differ outside "
                         f"the block dim {block_dim}")
    if src_ids.shape != dst_ids.shape or src_ids.dim() != 1:
        raise ValueError("src_ids and dst_ids must be 1-d and of equal length")


def copy_blocks(
    src: torch.Tensor, dst: torch.Tensor, src_ids: torch.Tensor, dst_ids: torch.Tensor,
    block_dim: int,
) -> None:
    """dst[..., dst_ids[i], ...] = src[..., src_ids[i], ...] along `block_dim` (Triton)."""
    _check(src, dst, src_ids, dst_ids, block_dim)
    if src_ids.numel() == 0 or src.numel() == 0:
        return
    s, d = _as_blocks(src, block_dim, "src"), _as_blocks(dst, block_dim, "dst")
    inner = s.shape[2]
    cap = 1 << 16 if interpreter_active() else 2048  # few big programs in the interpreter
    block = min(triton.next_power_of_2(inner), cap)
    grid = (src_ids.numel(), s.shape[0], triton.cdiv(inner, block))
    _copy_blocks_kernel[grid](
        s, d, src_ids.to(src.device), dst_ids.to(src.device), inner,
        s.stride(0), s.stride(1), d.stride(0), d.stride(1),
        BLOCK=block, num_warps=num_warps_for(block),
    )


def copy_blocks_ref(
    src: torch.Tensor, dst: torch.Tensor, src_ids: torch.Tensor, dst_ids: torch.Tensor,
    block_dim: int,
) -> None:
    """PyTorch reference: index_select the source blocks, index_copy them into dst."""
    _check(src, dst, src_ids, dst_ids, block_dim)
    if src_ids.numel() == 0:
        return
    blocks = as_bits(src).index_select(block_dim, src_ids.to(src.device, torch.long))
    as_bits(dst).index_copy_(block_dim, dst_ids.to(dst.device, torch.long), blocks)
