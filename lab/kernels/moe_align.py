"""MoE align: group the (token, expert) pairs of a routing by expert, padded to BLOCK_M (Triton +
PyTorch reference). The fused MoE GEMMs (`fused_moe.py`) walk the result one BLOCK_M block at a time.

    topk_ids [T, k] (flat index i = t*k + j, n = T*k pairs, sentinel = n)

    sorted_token_ids  | e0: i i i i i s s s | e2: i i i s | e3: i i i i i i i i | s s s ...
                      |<- BLOCK_M ->|<- ...            (e1 got no pair: no block)
    expert_ids        | 0 | 0 | 2 | 3 | 3 | -1 ...       (one per BLOCK_M block)
    num_tokens_post_padded = sum_e ceil(count_e / BLOCK_M) * BLOCK_M

Within an expert the flat indices are ascending (a stable sort), so the kernel and the reference
agree exactly. The buffers have a host-side upper bound of length (no device sync):
    blocks <= (n + min(E, n) * (BLOCK_M - 1)) // BLOCK_M
Entries past num_tokens_post_padded hold the sentinel (sorted_token_ids) or -1 (expert_ids).

Kernels (every pair's destination is computed, never searched for; expert ids must be in [0, E)):
- n <= SMALL_N: one program does it all (a single launch, the decode path): load the n ids,
  `tl.histogram` -> counts, `tl.cumsum` -> each expert's padded segment start, `tl.sort` of the
  keys id * N_PAD + i (stable by construction) -> the rank of each pair within its expert, then
  scatter. The expert of a block is written by the pairs that land in it (every block holds at
  least one real pair; duplicate writes store the same value).
- larger n: three launches over CHUNK-pair chunks: (1) per-chunk histograms -> counts[c, e];
  (2) one program scans them: counts[c, e] becomes the pairs of expert e in chunks before c, and
  segment starts, padding and tails are written; (3) each chunk sorts its keys and scatters.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SMALL_N = 4096  # pairs handled by the single-program kernel
CHUNK = 1024  # pairs per program in the multi-program path


@triton.jit
def _segment_starts(counts, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr):
    """counts [E_PAD] -> (padded segment start per expert, padded total)."""
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pad_end = tl.cumsum(padded, 0)
    return pad_end - padded, tl.sum(padded, 0)


@triton.jit
def _write_padding(sorted_ptr, expert_ids_ptr, counts, pad_start, total, n, sorted_len,
                   num_blocks, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                   PAD_J: tl.constexpr, FILL: tl.constexpr):
    """Sentinel n into each expert's padding and past `total`; -1 into expert_ids past the end."""
    gap = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M - counts  # [E_PAD], < BLOCK_M
    first = pad_start + counts
    for j0 in range(0, BLOCK_M, PAD_J):
        j = j0 + tl.arange(0, PAD_J)
        tl.store(sorted_ptr + first[:, None] + j[None, :], tl.zeros([E_PAD, PAD_J], tl.int32) + n,
                 mask=j[None, :] < gap[:, None])
    for p0 in range(total, sorted_len, FILL):
        p = p0 + tl.arange(0, FILL)
        tl.store(sorted_ptr + p, tl.zeros([FILL], tl.int32) + n, mask=p < sorted_len)
    for b0 in range(total // BLOCK_M, num_blocks, FILL):
        b = b0 + tl.arange(0, FILL)
        tl.store(expert_ids_ptr + b, tl.full([FILL], -1, tl.int32), mask=b < num_blocks)


@triton.jit
def _scatter_sorted(ids, offs, valid, base, sorted_ptr, expert_ids_ptr,
                    KEY_SHIFT: tl.constexpr, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr):
    """Stable scatter of one group of pairs (flat index offs, expert ids, `valid` mask).

    `base[e]` + r is the destination of the r-th pair (in ascending flat index) of expert e in
    this group. Invalid pairs carry expert E_PAD, so their keys sort after every valid key.
    """
    n_pad: tl.constexpr = 1 << KEY_SHIFT
    local = offs % n_pad
    keys = tl.sort(tl.where(valid, ids, E_PAD) * n_pad + local)
    hist = tl.histogram(tl.where(valid, ids, 0), E_PAD, mask=valid)
    first = tl.cumsum(hist, 0) - hist  # sorted position of each expert's first pair
    expert = tl.minimum(keys >> KEY_SHIFT, E_PAD - 1)
    rank = tl.arange(0, n_pad)  # sorted position
    dest = tl.gather(base - first, expert, 0) + rank
    ok = rank < tl.sum(hist, 0)
    flat = offs - local + (keys & (n_pad - 1))
    tl.store(sorted_ptr + dest, flat, mask=ok)
    tl.store(expert_ids_ptr + dest // BLOCK_M, expert, mask=ok)


@triton.jit
def _align_single_kernel(ids_ptr, sorted_ptr, expert_ids_ptr, num_post_ptr,
                         n, sorted_len, num_blocks,
                         N_PAD: tl.constexpr, KEY_SHIFT: tl.constexpr, E_PAD: tl.constexpr,
                         BLOCK_M: tl.constexpr, PAD_J: tl.constexpr, FILL: tl.constexpr):
    """All n pairs in one program (n <= N_PAD = 2**KEY_SHIFT)."""
    offs = tl.arange(0, N_PAD)
    valid = offs < n
    ids = tl.load(ids_ptr + offs, mask=valid, other=0).to(tl.int32)
    counts = tl.histogram(ids, E_PAD, mask=valid)
    pad_start, total = _segment_starts(counts, E_PAD, BLOCK_M)
    tl.store(num_post_ptr, total)
    _scatter_sorted(ids, offs, valid, pad_start, sorted_ptr, expert_ids_ptr,
                    KEY_SHIFT, E_PAD, BLOCK_M)
    _write_padding(sorted_ptr, expert_ids_ptr, counts, pad_start, total, n, sorted_len,
                   num_blocks, E_PAD, BLOCK_M, PAD_J, FILL)


@triton.jit
def _align_count_kernel(ids_ptr, counts_ptr, n, CHUNK: tl.constexpr, E_PAD: tl.constexpr):
    """counts[c, :] = histogram of the expert ids of chunk c = program_id(0)."""
    c = tl.program_id(0)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    valid = offs < n
    ids = tl.load(ids_ptr + offs, mask=valid, other=0).to(tl.int32)
    tl.store(counts_ptr + c * E_PAD + tl.arange(0, E_PAD), tl.histogram(ids, E_PAD, mask=valid))


@triton.jit
def _align_scan_kernel(counts_ptr, starts_ptr, sorted_ptr, expert_ids_ptr, num_post_ptr,
                       num_chunks, n, sorted_len, num_blocks,
                       E_PAD: tl.constexpr, ROWS: tl.constexpr, BLOCK_M: tl.constexpr,
                       PAD_J: tl.constexpr, FILL: tl.constexpr):
    """One program: counts[c, e] -> pairs of expert e in chunks < c (in place); starts[e] =
    padded segment start of expert e; num_post, padding and tails."""
    cols = tl.arange(0, E_PAD)
    carry = tl.zeros([E_PAD], tl.int32)
    for c0 in range(0, num_chunks, ROWS):
        rows = c0 + tl.arange(0, ROWS)
        ptrs = counts_ptr + rows[:, None] * E_PAD + cols[None, :]
        m = rows[:, None] < num_chunks
        tile = tl.load(ptrs, mask=m, other=0)
        tl.store(ptrs, tl.cumsum(tile, 0) - tile + carry[None, :], mask=m)
        carry += tl.sum(tile, 0)
    pad_start, total = _segment_starts(carry, E_PAD, BLOCK_M)
    tl.store(starts_ptr + cols, pad_start)
    tl.store(num_post_ptr, total)
    _write_padding(sorted_ptr, expert_ids_ptr, carry, pad_start, total, n, sorted_len,
                   num_blocks, E_PAD, BLOCK_M, PAD_J, FILL)


@triton.jit
def _align_scatter_kernel(ids_ptr, counts_ptr, starts_ptr, sorted_ptr, expert_ids_ptr, n,
                          CHUNK: tl.constexpr, KEY_SHIFT: tl.constexpr, E_PAD: tl.constexpr,
                          BLOCK_M: tl.constexpr):
    """Scatter chunk c = program_id(0): its r-th pair of expert e goes to
    starts[e] + (pairs of e in earlier chunks) + r."""
    c = tl.program_id(0)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    valid = offs < n
    ids = tl.load(ids_ptr + offs, mask=valid, other=0).to(tl.int32)
    cols = tl.arange(0, E_PAD)
    base = tl.load(starts_ptr + cols) + tl.load(counts_ptr + c * E_PAD + cols)
    _scatter_sorted(ids, offs, valid, base, sorted_ptr, expert_ids_ptr, KEY_SHIFT, E_PAD, BLOCK_M)


def max_num_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Upper bound on the BLOCK_M blocks of an alignment (host-side; no device sync)."""
    return (num_pairs + min(num_experts, num_pairs) * (block_m - 1)) // block_m


def _check(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> None:
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be [T, k], got shape {tuple(topk_ids.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1, got {num_experts}")
    if block_m < 1 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two, got {block_m}")


def moe_align(
    topk_ids: torch.Tensor, num_experts: int, block_m: int, *, chunk: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group topk_ids' flat pair indices by expert, each expert padded to a multiple of block_m.

    Returns (sorted_token_ids [max_num_blocks * block_m] int32, expert_ids [max_num_blocks]
    int32, num_tokens_post_padded [1] int32); see the module docstring. `chunk` (a power of two)
    forces the multi-program path with that many pairs per program (tests).
    """
    _check(topk_ids, num_experts, block_m)
    n = topk_ids.numel()
    dev = topk_ids.device
    nb = max_num_blocks(n, num_experts, block_m)
    sorted_ids = torch.empty(nb * block_m, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(nb, dtype=torch.int32, device=dev)
    if n == 0:
        return sorted_ids, expert_ids, torch.zeros(1, dtype=torch.int32, device=dev)
    num_post = torch.empty(1, dtype=torch.int32, device=dev)  # every path writes it
    ids = topk_ids.reshape(-1)
    ids = ids if ids.is_contiguous() else ids.contiguous()
    e_pad = triton.next_power_of_2(num_experts)
    pad_j = min(block_m, max(1, 4096 // e_pad))  # [E_PAD, PAD_J] padding tile
    common = dict(E_PAD=e_pad, BLOCK_M=block_m)
    fill = 1024
    if chunk is None and n <= SMALL_N:
        n_pad = max(16, triton.next_power_of_2(n))
        _align_single_kernel[(1,)](
            ids, sorted_ids, expert_ids, num_post, n, sorted_ids.numel(), nb,
            N_PAD=n_pad, KEY_SHIFT=n_pad.bit_length() - 1, PAD_J=pad_j, FILL=fill, **common,
            num_warps=4 if n_pad <= 1024 else 8,
        )
        return sorted_ids, expert_ids, num_post
    chunk = chunk or CHUNK
    if chunk < 2 or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two >= 2, got {chunk}")
    num_chunks = triton.cdiv(n, chunk)
    counts = torch.empty(num_chunks, e_pad, dtype=torch.int32, device=dev)
    starts = torch.empty(e_pad, dtype=torch.int32, device=dev)
    _align_count_kernel[(num_chunks,)](ids, counts, n, CHUNK=chunk, E_PAD=e_pad, num_warps=4)
    _align_scan_kernel[(1,)](
        counts, starts, sorted_ids, expert_ids, num_post, num_chunks, n, sorted_ids.numel(), nb,
        ROWS=max(1, min(triton.next_power_of_2(num_chunks), 4096 // e_pad)), PAD_J=pad_j,
        FILL=fill, **common, num_warps=4,
    )
    _align_scatter_kernel[(num_chunks,)](
        ids, counts, starts, sorted_ids, expert_ids, n,
        CHUNK=chunk, KEY_SHIFT=chunk.bit_length() - 1, **common, num_warps=4 if chunk <= 1024 else 8,
    )
    return sorted_ids, expert_ids, num_post


def moe_align_ref(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PyTorch reference of `moe_align` (same outputs, bit for bit)."""
    _check(topk_ids, num_experts, block_m)
    dev = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    n = flat.numel()
    nb = max_num_blocks(n, num_experts, block_m)
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    pad_start = padded.cumsum(0) - padded
    first = counts.cumsum(0) - counts
    order = torch.argsort(flat, stable=True)
    e = flat[order]
    dest = torch.arange(n, device=dev) - first[e] + pad_start[e]
    sorted_ids = torch.full((nb * block_m,), n, dtype=torch.int32, device=dev)
    sorted_ids[dest] = order.int()
    total = int(padded.sum())
    expert_ids = torch.full((nb,), -1, dtype=torch.int32, device=dev)
    expert_ids[: total // block_m] = torch.repeat_interleave(
        torch.arange(num_experts, device=dev, dtype=torch.int32), padded // block_m
    )
    return sorted_ids, expert_ids, torch.tensor([total], dtype=torch.int32, device=dev)
