"""Split-KV paged decode attention ("flash decoding"): one query token per request.

Cache layout per layer: k_cache, v_cache of shape (num_blocks, block_size, Hkv, D); token position p
of request b lives at block block_table[b, p // block_size], offset p % block_size (block 0 is the
null block that pads the table). The query of request b sits at position seq_lens[b] - 1 and sees
keys 0 .. seq_lens[b] - 1 (the last W of them with a sliding window), all already in the cache.

Stage 1 (`_decode_split_kernel`), grid (B, Hkv, num_splits): a program streams one split of one
request's keys for one KV head, in tiles of TILE_N keys (independent of block_size), with an online
softmax. The G = H / Hkv query heads of the KV head are packed as rows of one tl.dot (padded to
BLOCK_G ≥ 16), so K and V are read once per KV head. The grid depends only on B, Hkv and
num_splits; each program derives its key range from seq_lens on the GPU (CUDA-graph safe).
With num_splits == 1 the program writes the normalised output (and lse) directly; otherwise it
writes fp32 partials and LSEs that stage 2 (`merge_attn_states`) combines.

Per-layer features (AttentionSpec; constexpr switches, so a layer without them runs the plain
kernel; the values are per-layer constants and the sinks a parameter tensor: graph-safe):
- sliding window W: the query sees keys [max(0, L - W), L) only, and the splits partition that
  range: keys (and block-table entries) below it are never read, so a hybrid KV cache may hold
  the null block there.
- sinks (gpt-oss): one logit per query head in the softmax's denominator, no value. Split 0
  starts its rows at m = sink, l = 1 (online_softmax.py), so its LSE carries the sink and the
  merge counts it exactly once; the returned lse includes it.
- soft cap (Gemma-2): s -> cap * tanh(s / cap) on the scaled scores, before the mask; the
  scores are in log2 units (log2(e) folded into the scale), so the kernel caps with
  cap * log2(e), which is the same map (`soft_cap`).

fp8 cache (float8 e4m3fn, scheme in lab/kernels/fp8_kv.py): K/V tiles are loaded as fp8 and
converted to the query's dtype (exact: every e4m3 value is a bf16/fp16/fp32 value), the dots run
in that dtype, the K scale is folded into the softmax scale and the V scale multiplies the
output (exact for the power-of-two scales the backends use). k_scale / v_scale are fp32 [1]
device tensors (None: 1.0), read inside the kernel (no host sync, graph-safe). Runs in the
interpreter (fp8 -> fp32 conversion is exact there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from lab.kernels import check_dtype_supported, interpreter_active
from lab.kernels.fp8_kv import FP8_KV_DTYPE, dequantize_kv_ref
from lab.kernels.kv_cache_write import _scale_arg
from lab.kernels.merge_attn_states import merge_attn_states, merge_attn_states_ref
from lab.kernels.online_softmax import online_softmax_step, soft_cap

_LOG2E = 1.4426950408889634


@triton.jit
def _split_range(lo, hi, split, NUM_SPLITS: tl.constexpr, TILE_N: tl.constexpr):
    """Key range [start, end) of `split` over a request's keys [lo, hi) (lo > 0: a window).

    keys:  | lo: split 0 | split 1 | ... | split s: [lo + s·chunk, min(lo + (s+1)·chunk, hi)) | ...
    chunk = roundup(cdiv(hi - lo, NUM_SPLITS), TILE_N): every split starts a whole number of tiles
    after lo; when hi - lo is small the trailing splits have start >= hi and are empty (start =
    end).
    """
    per_split = tl.cdiv(hi - lo, NUM_SPLITS)
    chunk = tl.cdiv(per_split, TILE_N) * TILE_N
    start = tl.minimum(lo + split * chunk, hi)
    end = tl.minimum(start + chunk, hi)
    return start, end


@triton.jit
def _attend_tile(
    q, acc, m_i, l_i, start_n, end, bt_row_ptr, k_base, v_base,
    stride_kb, stride_ks, stride_vb, stride_vs, offs_d, mask_d, qk_scale, softcap,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """One online-softmax step over keys [start_n, start_n + TILE_N) ∩ [.., end) (log2 domain;
    `softcap` in log2 units too)."""
    offs_n = start_n + tl.arange(0, TILE_N)
    mask_n = offs_n < end
    blk = tl.load(bt_row_ptr + offs_n // BLOCK_SIZE, mask=mask_n, other=0).to(tl.int64)
    slot = (offs_n % BLOCK_SIZE).to(tl.int64)
    kv_mask = mask_n[:, None] & mask_d[None, :]
    k = tl.load(k_base + blk[:, None] * stride_kb + slot[:, None] * stride_ks + offs_d[None, :],
                mask=kv_mask, other=0.0).to(q.dtype)  # fp8 cache: exact upcast; else a no-op
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_G, TILE_N]
    if SOFTCAP:  # on the scores, before the mask
        qk = soft_cap(qk, softcap)
    qk = tl.where(mask_n[None, :], qk, float("-inf"))  # the tile holds >= 1 valid key
    v = tl.load(v_base + blk[:, None] * stride_vb + slot[:, None] * stride_vs + offs_d[None, :],
                mask=kv_mask, other=0.0).to(q.dtype)
    return online_softmax_step(qk, v, acc, m_i, l_i, DOT_PRECISION)


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, seq_lens_ptr, bt_ptr, o_ptr, lse_ptr, k_scale_ptr, v_scale_ptr,
    sinks_ptr, qk_scale, window, softcap, G,
    stride_qb, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_btb,
    stride_ob, stride_oh, stride_os,
    stride_lb, stride_lh, stride_ls,
    NUM_SPLITS: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr,
    BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, STORE_LSE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, KV_FP8: tl.constexpr, SLIDING: tl.constexpr,
    SINKS: tl.constexpr, SOFTCAP: tl.constexpr,
):
    """Program (b, kv_head, split): attention of the G query heads of kv_head over one split.

    Writes the split's normalised output and natural-log LSE at o_ptr/lse_ptr[b, head, split]
    (stride_os/stride_ls are 0 when writing the final output directly). Inner dims are contiguous.
    SLIDING: the splits cover keys [seq_len - window, seq_len) only; SINKS: split 0 counts each
    head's sink (sinks_ptr, natural log) in its denominator; SOFTCAP: `softcap` in log2 units.
    """
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    if SLIDING:  # keys below the window are never read (nor their block-table entries)
        lo = tl.maximum(seq_len - window, 0)
    else:
        lo = seq_len * 0
    start, end = _split_range(lo, seq_len, split, NUM_SPLITS, TILE_N)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    mask_g = offs_g < G
    mask_d = offs_d < HEAD_DIM  # constexpr bound: keeps 128-bit vector loads along D
    heads = (kvh * G + offs_g).to(tl.int64)  # query heads of this kv head (rows >= G are padding)
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_g[:, None] & mask_d[None, :], other=0.0)
    if KV_FP8:  # q keeps its dtype; K's scale joins the softmax scale
        qk_scale = qk_scale * tl.load(k_scale_ptr)
    else:
        q = q.to(k_ptr.dtype.element_ty)

    k_base = k_ptr + kvh.to(tl.int64) * stride_kh
    v_base = v_ptr + kvh.to(tl.int64) * stride_vh
    bt_row_ptr = bt_ptr + b * stride_btb
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    if SINKS:  # the sink column, once per row: in split 0 (the merge weighs it in by the LSE)
        sink = tl.load(sinks_ptr + heads, mask=mask_g, other=0.0).to(tl.float32)
        sink = sink * 1.4426950408889634  # log2 units, as the scores
        m_i = tl.where(split == 0, sink, m_i)
        l_i = tl.where(split == 0, 1.0, l_i)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    for start_n in range(start, end, TILE_N):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, start_n, end, bt_row_ptr, k_base, v_base,
            stride_kb, stride_ks, stride_vb, stride_vs, offs_d, mask_d, qk_scale, softcap,
            BLOCK_SIZE, TILE_N, DOT_PRECISION, SOFTCAP,
        )

    # Empty split (start == end): l_i = 0, m_i = -inf -> zeros and lse = -inf (split 0 with
    # sinks: zeros and lse = the sink, its share of the denominator).
    nonempty = l_i > 0.0
    l_safe = tl.where(nonempty, l_i, 1.0)
    o = acc / l_safe[:, None]
    if KV_FP8:
        o = o * tl.load(v_scale_ptr)
    o_ptrs = o_ptr + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + offs_d[None, :]
    tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty), mask=mask_g[:, None] & mask_d[None, :])
    if STORE_LSE:
        lse = tl.where(nonempty, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split * stride_ls, lse, mask=mask_g)


@dataclass
class DecodeWorkspace:
    """Reusable fp32 split partials: out [B_max, H, S_max, D] and lse [B_max, H, S_max].

    `get` returns views of the first B, H, S, D entries and reallocates (growing every dim to at
    least what is asked) only when a dim is too small or the device changes. Size it once before
    CUDA-graph capture so replays keep the same pointers.
    """

    out: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    _shape: tuple[int, int, int, int] = field(default=(0, 0, 0, 0))

    def get(self, b: int, h: int, s: int, d: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Views (partial_out [b, h, s, d], partial_lse [b, h, s]) into the workspace."""
        device = torch.device(device)
        fits = all(x <= cap for x, cap in zip((b, h, s, d), self._shape))
        if self.out is None or not fits or self.out.device != device:
            self._shape = tuple(max(x, cap) for x, cap in zip((b, h, s, d), self._shape))
            self.out = torch.empty(self._shape, dtype=torch.float32, device=device)
            self.lse = torch.empty(self._shape[:3], dtype=torch.float32, device=device)
        return self.out[:b, :h, :s, :d], self.lse[:b, :h, :s]


def choose_num_splits(
    batch_size: int,
    max_seq_len: int,
    num_sms: int = 132,
    min_keys_per_split: int = 256,
    max_splits: int = 16,
    num_kv_heads: int = 1,
) -> int:
    """Number of KV splits for a decode launch of batch_size x num_kv_heads x splits programs.

    Rule: S = 1 when B·Hkv >= num_sms (one program per SM already; splitting would only add
    the merge). Otherwise aim for two waves, B·Hkv·S >= 2·num_sms, so S = cdiv(2·num_sms, B·Hkv),
    capped so that every split keeps at least `min_keys_per_split` keys of a `max_seq_len`
    sequence and S <= max_splits (so S = 1 for short sequences too).
    Pass max_model_len as max_seq_len to get a value fixed across steps (graph capture); short
    actual sequences then just leave trailing splits empty. Pass num_kv_heads (per rank) for an
    exact program count; the default 1 counts requests only.
    """
    programs = max(1, batch_size * num_kv_heads)
    if programs >= num_sms:
        return 1
    by_occupancy = math.ceil(2 * num_sms / programs)
    by_length = max_seq_len // max(1, min_keys_per_split)
    return max(1, min(by_occupancy, by_length, max_splits))


def _launch_config(head_dim: int) -> dict:
    """Tile and launch parameters of stage 1 for Hopper (bandwidth-bound decode).

    Checked by compiling for sm_90 (no spills, cp.async-pipelined 128-bit K/V loads); not yet
    timed on a GPU. TILE_N x D K and V tiles of bf16 are 16 KiB each at D = 128.
    """
    if interpreter_active():  # cost is per op, not per element: fewer, larger tiles
        return dict(TILE_N=128, num_warps=4, num_stages=1)
    if head_dim <= 128:
        return dict(TILE_N=64, num_warps=4, num_stages=2)
    return dict(TILE_N=32, num_warps=8, num_stages=2)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    num_splits: int,
    workspace: DecodeWorkspace | None = None,
    lse: torch.Tensor | None = None,
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
    *,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
) -> None:
    """Decode attention of q [B, H, D] over the paged cache into out [B, H, D] (lse [B, H] fp32).
    An fp8 cache is dequantized with k_scale / v_scale (fp32 [1]; see the module docstring).
    The layer's features (module docstring): the query sees the last `sliding_window` keys
    only; `sinks` [H] (any float dtype, contiguous) adds one logit per head to the softmax's
    denominator (and to lse); `softcap` maps each scaled score s to softcap * tanh(s / softcap).

    One launch when num_splits == 1; otherwise stage 1 writes fp32 partials into `workspace`
    (a fresh one when None) and `merge_attn_states` combines them.
    """
    _check_inputs(q, k_cache, v_cache, out, seq_lens, block_table, num_splits)
    features = _check_features(q, sliding_window, sinks, softcap)
    batch, num_heads, head_dim = q.shape
    if batch == 0:
        return
    scales = (None, None)
    if k_cache.dtype == FP8_KV_DTYPE:
        scales = (_scale_arg(k_scale, q), _scale_arg(v_scale, q))
    if num_splits == 1:
        _stage1(q, k_cache, v_cache, seq_lens, block_table, scale, 1, out, lse, direct=True,
                scales=scales, features=features)
        return
    workspace = workspace if workspace is not None else DecodeWorkspace()
    p_out, p_lse = workspace.get(batch, num_heads, num_splits, head_dim, q.device)
    _stage1(q, k_cache, v_cache, seq_lens, block_table, scale, num_splits, p_out, p_lse,
            direct=False, scales=scales, features=features)
    merge_attn_states(p_out, p_lse, out, lse)


def _check_features(q, sliding_window, sinks, softcap) -> dict:
    """The features as the kernel's arguments: window (int, 0 = none), sinks (the tensor or
    None), softcap in log2 units (0.0 = none), and their constexpr switches."""
    if sliding_window is not None:
        assert sliding_window >= 1, f"sliding_window={sliding_window} must be >= 1"
    if sinks is not None:
        assert sinks.shape == q.shape[1:2] and sinks.is_contiguous(), (sinks.shape, q.shape)
        assert sinks.device == q.device
    if softcap is not None:
        assert softcap > 0, f"softcap={softcap} must be > 0"
    return dict(window=sliding_window or 0, sinks=sinks,
                softcap=softcap * _LOG2E if softcap is not None else 0.0,
                SLIDING=sliding_window is not None, SINKS=sinks is not None,
                SOFTCAP=softcap is not None)


def _check_inputs(q, k_cache, v_cache, out, seq_lens, block_table, num_splits) -> None:
    """Shape/stride preconditions of the kernels (inner dims contiguous)."""
    _, num_heads, head_dim = q.shape
    _, _, num_kv_heads, kd = k_cache.shape
    assert k_cache.shape == v_cache.shape and kd == head_dim, (k_cache.shape, q.shape)
    assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
    assert out.shape == q.shape and num_splits >= 1
    assert q.stride(-1) == 1 and out.stride(-1) == 1
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    assert block_table.dtype == torch.int32 and block_table.stride(-1) == 1
    assert seq_lens.dtype == torch.int32 and seq_lens.shape == q.shape[:1]
    check_dtype_supported(k_cache, "k_cache")


def _stage1(q, k_cache, v_cache, seq_lens, block_table, scale, num_splits, o, lse, direct,
            scales=(None, None), features=None):
    """Launch the split kernel; `direct` writes o [B, H, D] instead of partials [B, H, S, D].
    scales: (k_scale, v_scale) fp32 [1] tensors for an fp8 cache, else (None, None);
    features: `_check_features`'s (None: none)."""
    features = dict(features or _check_features(q, None, None, None))
    sinks = features.pop("sinks")
    batch, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    store_lse = lse is not None
    if direct:
        o_strides = (o.stride(0), o.stride(1), 0)
        l_strides = (lse.stride(0), lse.stride(1), 0) if store_lse else (0, 0, 0)
    else:
        o_strides = (o.stride(0), o.stride(1), o.stride(2))
        l_strides = tuple(lse.stride())
    cfg = _launch_config(head_dim)
    kv_fp8 = k_cache.dtype == FP8_KV_DTYPE
    compute_dtype = q.dtype if kv_fp8 else k_cache.dtype
    precision = "ieee" if compute_dtype == torch.float32 else "tf32"
    k_scale, v_scale = scales if kv_fp8 else (seq_lens, seq_lens)  # unused pointers
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q, k_cache, v_cache, seq_lens, block_table, o, lse if store_lse else o, k_scale, v_scale,
        sinks if sinks is not None else seq_lens,  # an unused pointer without sinks
        scale * _LOG2E, features.pop("window"), features.pop("softcap"), group,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.stride(0),
        *o_strides, *l_strides,
        NUM_SPLITS=num_splits, BLOCK_SIZE=block_size, TILE_N=cfg["TILE_N"],
        BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        STORE_LSE=store_lse, DOT_PRECISION=precision, KV_FP8=kv_fp8, **features,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )


def paged_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    num_splits: int,
    lse: torch.Tensor | None = None,
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
    *,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """PyTorch reference (fp32 math) of the split computation; writes out (and lse), returns lse.
    An fp8 cache is dequantized (q_fp8 * scale, `dequantize_kv_ref`) before the math.

    Splits use chunk = cdiv(n, num_splits) without tile rounding (the math is the same) over the
    n keys the query sees (the last `sliding_window` of them with a window); scores are
    soft-capped (softcap * tanh(s / softcap)); split 0 counts each head's sink logit as one more
    column (no value); each split's partial output and LSE are merged by
    `merge_attn_states_ref`.
    """
    batch, num_heads, head_dim = q.shape
    p_out = torch.zeros(batch, num_heads, num_splits, head_dim, device=q.device)
    p_lse = torch.full((batch, num_heads, num_splits), float("-inf"), device=q.device)
    for b in range(batch):
        keys, vals = _gather_request_kv(k_cache, v_cache, block_table[b], int(seq_lens[b]),
                                        k_scale, v_scale)
        if sliding_window is not None:
            keys, vals = keys[-sliding_window:], vals[-sliding_window:]
        keys = keys.repeat_interleave(num_heads // k_cache.shape[2], dim=1)  # [L, H, D]
        vals = vals.repeat_interleave(num_heads // k_cache.shape[2], dim=1)
        chunk = -(-keys.shape[0] // num_splits)
        for s in range(num_splits):
            lo, hi = s * chunk, min((s + 1) * chunk, keys.shape[0])
            sink = sinks is not None and s == 0
            if lo >= hi and not sink:
                continue
            scores = torch.einsum("hd,lhd->hl", q[b].float(), keys[lo:hi]) * scale
            if softcap is not None:
                scores = softcap * torch.tanh(scores / softcap)
            if sink:
                scores = torch.cat((scores, sinks.float()[:, None]), dim=-1)
            probs = torch.softmax(scores, -1)[:, :max(0, hi - lo)]  # the sink's column dropped
            p_lse[b, :, s] = torch.logsumexp(scores, dim=-1)
            p_out[b, :, s] = torch.einsum("hl,lhd->hd", probs, vals[lo:hi])
    return merge_attn_states_ref(p_out, p_lse, out, lse)


def _gather_request_kv(k_cache, v_cache, table_row, seq_len, k_scale=None, v_scale=None):
    """Keys and values [L, Hkv, D] (fp32, dequantized) of positions 0..L-1 of one request."""
    pos = torch.arange(seq_len, device=k_cache.device)
    blocks = table_row.long()[pos // k_cache.shape[1]]
    slots = pos % k_cache.shape[1]
    if k_cache.dtype == FP8_KV_DTYPE:
        k_scale, v_scale = _scale_arg(k_scale, k_cache), _scale_arg(v_scale, k_cache)
    return (dequantize_kv_ref(k_cache[blocks, slots], k_scale),
            dequantize_kv_ref(v_cache[blocks, slots], v_scale))
