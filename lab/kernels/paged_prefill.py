"""Varlen paged attention for prefill / extend / mixed batches (Triton + PyTorch reference).

Request b owns query rows query_start_loc[b] .. query_start_loc[b+1]-1 (q_len of them) and
seq_lens[b] keys, all read from the paged cache through block_table[b] (the step's new K/V were
written there first by `write_kv_cache`). With ctx = seq_len - q_len, query row i sits at position
ctx + i and attends causally to keys 0 .. ctx + i (the last W of them with a sliding window).

Kernel design (kernel-targets §3.1, vLLM unified attention):
- grid (cdiv(max_query_len, BLOCK_Q), B, Hkv); a program whose q-block starts past its request's
  q_len returns at once.
- GQA packing: the G = H / Hkv query heads sharing a KV head and BLOCK_Q query tokens form
  BLOCK_M = BLOCK_Q * G (padded to a power of two >= 16) rows, so each K/V tile is loaded once per
  KV head and `tl.dot` has M >= 16. Row r is (token q0 + r // G, head kvh * G + r % G).
- The KV loop walks TILE_N key positions at a time, independent of the cache block size; a key at
  position p lives at block block_table[b, p // block_size], offset p % block_size.
- FlashAttention-2 online softmax in fp32 (exp2 with log2(e) folded into the scale).
- fp8 cache (float8 e4m3fn, scheme in lab/kernels/fp8_kv.py): K/V tiles are loaded as fp8 and
  converted to q's dtype (exact), the K scale is folded into the softmax scale and the V scale
  multiplies the output (exact for power-of-two scales). k_scale / v_scale are fp32 [1] device
  tensors (None: 1.0). Runs in the interpreter.

Per-layer features (AttentionSpec; constexpr switches, so a layer without them runs the plain
kernel):
- sliding window W: query i sees keys j with i - W < j <= i. A program's KV loop starts at the
  tile holding its first row's first key (ctx + q0 - W + 1, rounded down to TILE_N): whole
  tiles below it are skipped, and the masked edge tiles read no key (nor block-table entry)
  below it, so a hybrid KV cache may hold the null block there. The tiles every row sees whole
  still run unmasked (the kernel's diagram of phases).
- sinks (gpt-oss): one logit per query head joins each row's softmax as a column with no
  value: rows start at m = sink, l = 1 (online_softmax.py).
- soft cap (Gemma-2): s -> cap * tanh(s / cap) on the scaled scores, before the mask, in the
  log2 units the scores are in (cap * log2(e): the same map, `soft_cap`).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from lab.kernels import check_dtype_supported, interpreter_active
from lab.kernels.fp8_kv import FP8_KV_DTYPE, dequantize_kv_ref
from lab.kernels.kv_cache_write import _scale_arg
from lab.kernels.online_softmax import online_softmax_step, soft_cap

_LOG2E = 1.4426950408889634


@triton.jit
def _attend_tile(
    acc, l_i, m_i, q, q_pos,
    k_cache_ptr, v_cache_ptr, bt_row_ptr, kv_head_off, start, kv_lo, kv_end, qk_scale, window,
    softcap, stride_cb, stride_co,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    MASKED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr,
    SLIDING: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """One online-softmax step over keys start .. start+TILE_N-1 of one request and KV head.

    MASKED=False is only used for tiles every row may fully see (no causal, window or length
    edge). A masked tile reads only keys in [kv_lo, kv_end) (kv_lo: the program's first key).
    """
    pos = start + tl.arange(0, TILE_N)
    dims = tl.arange(0, HEAD_DIM)
    if SLIDING:  # keys below the window are not read (a hybrid cache's null block is there)
        in_seq = (pos >= kv_lo) & (pos < kv_end)
    else:
        in_seq = pos < kv_end
    if MASKED:
        blk = tl.load(bt_row_ptr + pos // BLOCK_SIZE, mask=in_seq, other=0)
    else:
        blk = tl.load(bt_row_ptr + pos // BLOCK_SIZE)
    # Offset of (block, in-block offset, kv head) for each key; int64: caches exceed 2^31 elements.
    key_off = blk.to(tl.int64) * stride_cb + (pos % BLOCK_SIZE) * stride_co + kv_head_off
    k_ptrs = k_cache_ptr + key_off[None, :] + dims[:, None]  # [D, TILE_N] (K transposed)
    v_ptrs = v_cache_ptr + key_off[:, None] + dims[None, :]  # [TILE_N, D]
    if MASKED:
        k = tl.load(k_ptrs, mask=in_seq[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=in_seq[:, None], other=0.0)
    else:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    if KV_FP8:  # exact upcast to q's dtype; the scales are applied outside
        k = k.to(q.dtype)
        v = v.to(q.dtype)

    s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, TILE_N], log2 units
    if SOFTCAP:  # on the scores, before the mask (softcap in log2 units too)
        s = soft_cap(s, softcap)
    if MASKED:
        visible = (pos[None, :] <= q_pos[:, None]) & in_seq[None, :]
        if SLIDING:
            visible = visible & (pos[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
    # Each row's m is finite by now: it saw key 0 in the first tile, or starts from its sink or
    # from a finite floor (a window can mask a row's whole first tiles).
    acc, m_new, l_i = online_softmax_step(s, v, acc, m_i, l_i, DOT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def _paged_prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    qsl_ptr, seq_lens_ptr, bt_ptr, k_scale_ptr, v_scale_ptr, sinks_ptr,
    qk_scale, window, softcap,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    stride_cb, stride_co, stride_ch,
    G: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr,
    SLIDING: tl.constexpr,
    SINKS: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """Attention of BLOCK_Q query tokens x G heads of request program_id(1), KV head program_id(2)."""
    b = tl.program_id(1)
    kvh = tl.program_id(2)
    q_start = tl.load(qsl_ptr + b)
    q_len = tl.load(qsl_ptr + b + 1) - q_start
    q0 = tl.program_id(0) * BLOCK_Q
    if q0 >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + b)
    ctx = seq_len - q_len
    q1 = tl.minimum(q0 + BLOCK_Q, q_len)  # one past the program's last valid token

    rows = tl.arange(0, BLOCK_M)
    tok = q0 + rows // G
    row_ok = (rows < BLOCK_Q * G) & (tok < q_len)  # rows past BLOCK_Q*G pad BLOCK_M to a pow2
    row_off = (q_start + tok).to(tl.int64)
    head = kvh * G + rows % G
    dims = tl.arange(0, HEAD_DIM)
    q_ptrs = q_ptr + (row_off * stride_qt + head * stride_qh)[:, None] + dims[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
    q_pos = ctx + tl.minimum(tok, q1 - 1)  # padding rows: the last row's (it sees a key)
    if KV_FP8:
        qk_scale = qk_scale * tl.load(k_scale_ptr)

    # Key ranges of this program (positions ctx + q0 .. ctx + q1 - 1):
    #   keys: | never read | ..... kv_start | ...... mid_start | .... full_end | ..... kv_end |
    #         |            | window edge: masked | no masks    | causal: masked | never read  |
    # full_end = (ctx + q0 + 1) rounded down to TILE_N: every row (position >= ctx + q0) sees all
    # of the keys below it; kv_end = ctx + q1 <= seq_len: keys past the last row's position are
    # skipped. Without a window kv_start = mid_start = 0. With a window W the first row sees
    # keys >= kv_lo = ctx + q0 - W + 1: the loop starts at its tile (kv_start, rounded down:
    # whole tiles below the window are skipped, the keys below kv_lo in that tile are not
    # read); the last row sees keys >= ctx + q1 - W, so from mid_start (that rounded up) every
    # row sees whole tiles again.
    kv_end = ctx + q1
    full_end = (ctx + q0 + 1) // TILE_N * TILE_N
    kv_lo = ctx * 0
    mid_start = ctx * 0

    bt_row_ptr = bt_ptr + b.to(tl.int64) * stride_bt
    kv_head_off = kvh.to(tl.int64) * stride_ch
    if SINKS:  # the sink column (no value) in every row's denominator: m = sink, l = 1
        m_i = tl.load(sinks_ptr + head).to(tl.float32) * 1.4426950408889634
        l_i = tl.full([BLOCK_M], 1.0, tl.float32)
    elif SLIDING:  # a finite floor: a row may see none of the window edge's first tiles
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if SLIDING:
        kv_lo = tl.maximum(ctx + q0 - window + 1, 0)
        kv_start = kv_lo // TILE_N * TILE_N
        mid_start = tl.minimum(tl.cdiv(tl.maximum(kv_end - window, 0), TILE_N) * TILE_N,
                               full_end)
        for start in range(kv_start, mid_start, TILE_N):
            acc, l_i, m_i = _attend_tile(
                acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, bt_row_ptr, kv_head_off,
                start, kv_lo, kv_end, qk_scale, window, softcap, stride_cb, stride_co,
                BLOCK_SIZE, TILE_N, HEAD_DIM, True, DOT_PRECISION, KV_FP8, SLIDING, SOFTCAP,
            )
    for start in range(mid_start, full_end, TILE_N):
        acc, l_i, m_i = _attend_tile(
            acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, bt_row_ptr, kv_head_off,
            start, kv_lo, kv_end, qk_scale, window, softcap, stride_cb, stride_co,
            BLOCK_SIZE, TILE_N, HEAD_DIM, False, DOT_PRECISION, KV_FP8, SLIDING, SOFTCAP,
        )
    for start in range(full_end, kv_end, TILE_N):
        acc, l_i, m_i = _attend_tile(
            acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, bt_row_ptr, kv_head_off,
            start, kv_lo, kv_end, qk_scale, window, softcap, stride_cb, stride_co,
            BLOCK_SIZE, TILE_N, HEAD_DIM, True, DOT_PRECISION, KV_FP8, SLIDING, SOFTCAP,
        )

    acc = acc / l_i[:, None]
    if KV_FP8:
        acc = acc * tl.load(v_scale_ptr)
    o_ptrs = out_ptr + (row_off * stride_ot + head * stride_oh)[:, None] + dims[None, :]
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def pick_config(max_query_len: int, group: int, head_dim: int, elem_size: int = 2) -> dict:
    """Tile sizes and launch options for the H100/H200 (also valid in the interpreter).

    BLOCK_M grows with the rows a q-block can fill (max_query_len * G): 16 for decode-like
    batches, up to 128 for long prefill chunks, where a larger M raises the tensor-core reuse of
    each K/V tile (wgmma needs M >= 64). TILE_N = 64, or 32 at small M; 8 warps at M = 128 (or
    M = 64 with d = 256). fp32 (elem_size 4, a test dtype on GPU) uses TILE_N = 32, M <= 64 at
    d = 128 and 2 stages to fit shared memory. Compiled for sm_90 without a GPU (bf16/fp16,
    d 64-256): no register spills, <= 161 KiB shared memory (<= 97 KiB for d <= 128).
    """
    min_m = max(16, triton.next_power_of_2(group))
    cap = 128 if head_dim * elem_size <= 256 else 64
    block_m = max(min_m, min(cap, triton.next_power_of_2(max(1, max_query_len * group))))
    tile_n = 32 if block_m <= 32 or elem_size > 2 else 64
    return {
        "BLOCK_M": block_m,
        "TILE_N": tile_n,
        "num_warps": 8 if block_m >= 128 or (head_dim >= 256 and block_m >= 64) else 4,
        "num_stages": 3 if block_m >= 64 and elem_size <= 2 else 2,
    }


def _check_args(q, k_cache, v_cache, out, query_start_loc, seq_lens, block_table) -> None:
    """Host-side shape/layout checks (no device sync)."""
    t, h, d = q.shape
    assert out.shape == q.shape, (out.shape, q.shape)
    assert k_cache.dim() == 4 and k_cache.shape == v_cache.shape, (k_cache.shape, v_cache.shape)
    assert k_cache.stride() == v_cache.stride(), "K and V caches must share one layout"
    assert k_cache.shape[3] == d, (k_cache.shape, d)
    assert h % k_cache.shape[2] == 0, f"{h} query heads not a multiple of {k_cache.shape[2]}"
    assert d >= 16 and d & (d - 1) == 0, f"head_dim must be a power of two >= 16, got {d}"
    b = seq_lens.shape[0]
    assert query_start_loc.shape == (b + 1,) and block_table.shape[0] == b
    assert block_table.stride(1) == 1, "block_table rows must be contiguous"
    for x in (q, out, k_cache, v_cache):
        assert x.stride(-1) == 1, "last (head_dim) dimension must be contiguous"


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_query_len: int,
    scale: float,
    *,
    block_m: int | None = None,
    tile_n: int | None = None,
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
) -> None:
    """Causal varlen attention of q [T, H, D] over the paged cache, written into out [T, H, D].

    Rows of `out` past query_start_loc[B] are left untouched. `block_m` / `tile_n` override the
    tile choice of `pick_config` (tests and tuning); block_m must be a power of two >= 16 and
    >= H / Hkv, tile_n a power of two >= 16. An fp8 cache is dequantized with k_scale /
    v_scale (fp32 [1]; see the module docstring). The layer's features (module docstring): a
    query at position i sees keys j > i - sliding_window only; `sinks` [H] (any float dtype,
    contiguous) adds one logit per head to the softmax's denominator; `softcap` maps each
    scaled score s to softcap * tanh(s / softcap).
    """
    _check_args(q, k_cache, v_cache, out, query_start_loc, seq_lens, block_table)
    assert sliding_window is None or sliding_window >= 1, sliding_window
    assert sinks is None or (sinks.shape == q.shape[1:2] and sinks.is_contiguous()), sinks
    assert softcap is None or softcap > 0, softcap
    check_dtype_supported(q, "paged_attention q")  # bf16 tl.dot is garbage in the interpreter
    check_dtype_supported(k_cache, "paged_attention kv cache")
    _, h, d = q.shape
    hkv = k_cache.shape[2]
    b = seq_lens.shape[0]
    if b == 0 or max_query_len <= 0:
        return
    g = h // hkv
    cfg = pick_config(max_query_len, g, d, q.element_size())
    if interpreter_active():  # cost is per op, not per element: fewer, larger tiles
        cfg["BLOCK_M"] = max(cfg["BLOCK_M"], min(128, triton.next_power_of_2(max_query_len * g)))
        cfg["TILE_N"] = 128
    if block_m is not None:
        cfg["BLOCK_M"] = block_m
    if tile_n is not None:
        cfg["TILE_N"] = tile_n
    assert cfg["BLOCK_M"] >= max(16, g) and cfg["BLOCK_M"] & (cfg["BLOCK_M"] - 1) == 0
    assert cfg["TILE_N"] >= 16 and cfg["TILE_N"] & (cfg["TILE_N"] - 1) == 0
    block_q = cfg["BLOCK_M"] // g
    kv_fp8 = k_cache.dtype == FP8_KV_DTYPE
    if kv_fp8:
        k_scale, v_scale = _scale_arg(k_scale, q), _scale_arg(v_scale, q)
    else:
        k_scale = v_scale = seq_lens  # unused pointers
    grid = (triton.cdiv(max_query_len, block_q), b, hkv)
    _paged_prefill_kernel[grid](
        q, k_cache, v_cache, out,
        query_start_loc, seq_lens, block_table, k_scale, v_scale,
        sinks if sinks is not None else seq_lens,  # an unused pointer without sinks
        scale * _LOG2E, sliding_window or 0, softcap * _LOG2E if softcap is not None else 0.0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_table.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        G=g,
        BLOCK_Q=block_q,
        HEAD_DIM=d,
        BLOCK_SIZE=k_cache.shape[1],
        # fp32: 3-pass tf32 on tensor cores (~fp32 accurate); ignored for 16-bit inputs
        DOT_PRECISION="tf32x3" if q.dtype == torch.float32 else "tf32",
        KV_FP8=kv_fp8,
        SLIDING=sliding_window is not None,
        SINKS=sinks is not None,
        SOFTCAP=softcap is not None,
        **cfg,
    )


def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_query_len: int,
    scale: float,
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
) -> None:
    """PyTorch reference of `paged_attention`: per request, dense causal attention in fp32 over
    keys gathered from the cache through the block table; GQA by repeat_interleave. Features:
    scores soft-capped before the mask, the mask narrowed to the window (no key below the
    first query's window is read), each head's sink logit one more softmax column (dropped
    before the values)."""
    block_size = k_cache.shape[1]
    group = q.shape[1] // k_cache.shape[2]
    if k_cache.dtype == FP8_KV_DTYPE:
        k_scale, v_scale = _scale_arg(k_scale, q), _scale_arg(v_scale, q)
    qsl = query_start_loc.tolist()
    for b, seq_len in enumerate(seq_lens.tolist()):
        start, end = qsl[b], qsl[b + 1]
        q_len = end - start
        if q_len == 0:
            continue
        lo = 0  # the first key a query sees: below a window's, none is read
        if sliding_window is not None:
            lo = max(0, seq_len - q_len - sliding_window + 1)
        pos = torch.arange(lo, seq_len, device=q.device)
        blk, off = block_table[b, pos // block_size].long(), pos % block_size
        k = dequantize_kv_ref(k_cache[blk, off], k_scale).repeat_interleave(group, dim=1)
        v = dequantize_kv_ref(v_cache[blk, off], v_scale).repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[start:end].float(), k) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        q_pos = seq_len - q_len + torch.arange(q_len, device=q.device)
        hidden = pos[None, :] > q_pos[:, None]
        if sliding_window is not None:
            hidden |= pos[None, :] <= q_pos[:, None] - sliding_window
        scores.masked_fill_(hidden, -math.inf)
        if sinks is not None:
            sink = sinks.float()[:, None, None].expand(-1, q_len, 1)
            probs = torch.cat((scores, sink), dim=-1).softmax(-1)[..., :-1]
        else:
            probs = scores.softmax(-1)
        out[start:end] = torch.einsum("hqk,khd->qhd", probs, v).to(out.dtype)
