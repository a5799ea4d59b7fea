"""Split-KV paged decode for multi-head latent attention (MLA, DeepSeek-V2/V3), weights absorbed.

With W_UK absorbed into the query (q_nope = q_nope_orig · W_UK, width L = kv_lora_rank) every
query head attends to the same single latent "KV head", and W_UV is applied after attention:

    score[h, j] = scale · (q_nope[h] · c_j + q_pe[h] · k_pe_j)
    out[h]      = Σ_j softmax_j(score[h]) · c_j          (width L; the caller applies W_UV)

Cache layout per layer, one row of L + R values per token (row stride may exceed L + R):

    kv_cache[num_blocks, block_size, L + R]
    token row:  | c_kv (latent, L = 512) .................... | k_pe (rope, R = 64) |
                  `-- both K (with k_pe) and V (alone) -----'

Token position p of request b lives at block block_table[b, p // block_size], offset
p % block_size (block 0 is the null block that pads the table). The query of request b sees keys
0 .. seq_lens[b] - 1, all already in the cache.

Stage 1 (`_mla_split_kernel`), grid (cdiv(H, BLOCK_H), B, num_splits). Program (hb, b, s) packs
query heads hb·BLOCK_H .. +BLOCK_H (padded to >= 16 rows, masked) into the M dimension of tl.dot
and streams split s of request b's keys (`_split_range`: tile-aligned, trailing splits may be
empty) in tiles of TILE_N tokens, independent of block_size (the TILE_N page indices are loaded
once per tile). Per tile it loads the latent tile C [TILE_N, L] and the rope tile P [TILE_N, R]
once and does

    S   = Q_nope · Cᵀ + Q_pe · Pᵀ        [BLOCK_H, TILE_N]   (two dots, one accumulator)
    acc = acc · α + softmax-numerator(S) · C    [BLOCK_H, L]   (V is the same C tile)

with an online softmax in the log2 domain. L and R need not be powers of two: the latent and rope
widths are padded to BLOCK_L / BLOCK_R and masked. The head-block axis is the fastest-varying grid
axis, so the programs that share one request's latent tiles are launched together and the
re-reads hit L2. The grid depends only on H, B and num_splits (CUDA-graph safe). With one split
the program writes `out` directly; otherwise fp32 partials and natural-log LSEs go to a
`DecodeWorkspace` and `merge_attn_states` combines them.

Configs (`_launch_config`), chosen by compiling for sm_90 and reading the resource usage (no
register spills, tensor-core dots, cp.async-pipelined tile loads); not yet timed on a GPU. The
whole 512-wide output of a head block stays in one program (fp32 accumulator in registers)
instead of being split across programs: a program owning half of O would still need the full
576-wide QK, so it would recompute it or re-read the tile.
  * H <= 16 (DeepSeek at TP8, memory-bound): BLOCK_H = 16, TILE_N = 32, 8 warps, 3 stages:
    128 registers/thread, 55 KiB shared (a 32x576 bf16 tile is 36 KiB), mma.sync; 2 CTAs/SM.
  * 16 < H <= 32: BLOCK_H = 32, TILE_N = 16, 8 warps, 3 stages (~200 registers, mma.sync).
  * H > 32 (128 heads at TP1, compute-bound): BLOCK_H = 64, TILE_N = 16, 8 warps, 3 stages.
    M = 64 lets Triton use wgmma; the two warpgroups split the PV product along L (two 64x256
    halves of O, as FlashMLA does), so the 64x512 fp32 accumulator is 128 registers/thread
    (254 in all, no spills, 108-128 KiB shared). 128 heads take 2 head-block programs per
    (request, split); they run side by side and the second latent read comes from L2.
    (BLOCK_H = 128 does not fit: 256 accumulator registers per thread at 8 warps.)
  * Interpreter: cost is per op, not per element, so larger tiles (TILE_N = 64) and up to 64
    heads per program.
fp8 cache (float8 e4m3fn, scheme in lab/kernels/fp8_kv.py; per layer one scale s_c for the kv_c
part and one s_pe for the k_pe part): the tiles are loaded as fp8 and converted to the query's
dtype (exact), and

    S   = s_c · (Q_nope · Cᵀ) + s_pe · (Q_pe · Pᵀ),     out = s_c · (softmax(S) · C)

(exact folds for power-of-two scales). The scales are fp32 [1] device tensors (None: 1.0) read
in the kernel. Runs in the interpreter.

`mla_head_blocks(H)` returns the programs per (request, split) so that callers can size the
split count with `choose_num_splits(..., num_kv_heads=mla_head_blocks(H))`.
"""

from __future__ import annotations

import numbers

import torch
import triton
import triton.language as tl

from lab.kernels import check_dtype_supported, interpreter_active
from lab.kernels.fp8_kv import FP8_KV_DTYPE, dequantize_kv_ref
from lab.kernels.kv_cache_write import _scale_arg
from lab.kernels.merge_attn_states import merge_attn_states
from lab.kernels.online_softmax import online_softmax_step
from lab.kernels.paged_decode import DecodeWorkspace, _split_range

__all__ = [
    "DecodeWorkspace",
    "mla_decode_attention",
    "mla_decode_attention_ref",
    "mla_head_blocks",
]

_LOG2E = 1.4426950408889634


@triton.jit
def _mla_attend_tile(
    q_nope, q_pe, acc, m_i, l_i, start_n, end, bt_row_ptr, kv_ptr, stride_kvb, stride_kvs,
    offs_l, mask_l, offs_r, mask_r, qk_scale, c_scale, pe_scale,
    LORA: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr, KV_FP8: tl.constexpr,
):
    """One online-softmax step over keys [start_n, start_n + TILE_N) ∩ [.., end) (log2 domain)."""
    offs_n = start_n + tl.arange(0, TILE_N)
    mask_n = offs_n < end
    blk = tl.load(bt_row_ptr + offs_n // BLOCK_SIZE, mask=mask_n, other=0).to(tl.int64)
    row = kv_ptr + blk * stride_kvb + (offs_n % BLOCK_SIZE).to(tl.int64) * stride_kvs
    c = tl.load(row[:, None] + offs_l[None, :], mask=mask_n[:, None] & mask_l[None, :],
                other=0.0)  # [TILE_N, BLOCK_L]: keys' latent part and the values
    kpe = tl.load(row[:, None] + LORA + offs_r[None, :], mask=mask_n[:, None] & mask_r[None, :],
                  other=0.0)  # [TILE_N, BLOCK_R]
    if KV_FP8:  # exact upcast to the query dtype; s_c also scales the output (in the caller)
        c = c.to(q_nope.dtype)
        kpe = kpe.to(q_pe.dtype)
        qk = tl.dot(q_nope, tl.trans(c), input_precision=DOT_PRECISION) * c_scale
        qk += tl.dot(q_pe, tl.trans(kpe), input_precision=DOT_PRECISION) * pe_scale
    else:
        qk = tl.dot(q_nope, tl.trans(c), input_precision=DOT_PRECISION)
        qk = tl.dot(q_pe, tl.trans(kpe), acc=qk, input_precision=DOT_PRECISION)
    qk = tl.where(mask_n[None, :], qk * qk_scale, float("-inf"))  # [BLOCK_H, TILE_N], >= 1 key
    return online_softmax_step(qk, c, acc, m_i, l_i, DOT_PRECISION)  # V is the latent tile


@triton.jit
def _mla_split_kernel(
    qn_ptr, qp_ptr, kv_ptr, seq_lens_ptr, bt_ptr, o_ptr, lse_ptr, c_scale_ptr, pe_scale_ptr,
    qk_scale, H,
    stride_qnb, stride_qnh, stride_qpb, stride_qph,
    stride_kvb, stride_kvs,
    stride_btb,
    stride_ob, stride_oh, stride_os,
    stride_lb, stride_lh, stride_ls,
    NUM_SPLITS: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr,
    BLOCK_H: tl.constexpr, LORA: tl.constexpr, BLOCK_L: tl.constexpr, ROPE: tl.constexpr,
    BLOCK_R: tl.constexpr, STORE_LSE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    """Program (head block, b, split): BLOCK_H query heads of request b over one key split.

    Writes the split's normalised output [.., L] and natural-log LSE at o_ptr/lse_ptr[b, h, split]
    (stride_os is 0 and no LSE is stored when writing the final output directly). Inner dims are
    contiguous.
    """
    hb = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    start, end = _split_range(seq_len * 0, seq_len, split, NUM_SPLITS, TILE_N)

    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    heads = offs_h.to(tl.int64)
    offs_l = tl.arange(0, BLOCK_L)
    mask_l = offs_l < LORA  # constexpr bound: keeps 128-bit vector loads along L
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < ROPE
    q_nope = tl.load(qn_ptr + b * stride_qnb + heads[:, None] * stride_qnh + offs_l[None, :],
                     mask=mask_h[:, None] & mask_l[None, :], other=0.0)
    q_pe = tl.load(qp_ptr + b * stride_qpb + heads[:, None] * stride_qph + offs_r[None, :],
                   mask=mask_h[:, None] & mask_r[None, :], other=0.0)
    if KV_FP8:
        c_scale = tl.load(c_scale_ptr)
        pe_scale = tl.load(pe_scale_ptr)
    else:
        q_nope = q_nope.to(kv_ptr.dtype.element_ty)
        q_pe = q_pe.to(kv_ptr.dtype.element_ty)
        c_scale = 1.0
        pe_scale = 1.0

    bt_row_ptr = bt_ptr + b * stride_btb
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_L], dtype=tl.float32)
    for start_n in range(start, end, TILE_N):
        acc, m_i, l_i = _mla_attend_tile(
            q_nope, q_pe, acc, m_i, l_i, start_n, end, bt_row_ptr, kv_ptr, stride_kvb, stride_kvs,
            offs_l, mask_l, offs_r, mask_r, qk_scale, c_scale, pe_scale,
            LORA, BLOCK_SIZE, TILE_N, DOT_PRECISION, KV_FP8,
        )

    # Empty split (start == end): l_i = 0, m_i = -inf -> zeros and lse = -inf.
    nonempty = l_i > 0.0
    l_safe = tl.where(nonempty, l_i, 1.0)
    o = acc / l_safe[:, None]
    if KV_FP8:
        o = o * c_scale
    o_ptrs = o_ptr + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + offs_l[None, :]
    tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty), mask=mask_h[:, None] & mask_l[None, :])
    if STORE_LSE:
        lse = tl.where(nonempty, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split * stride_ls, lse, mask=mask_h)


def _launch_config(num_heads: int) -> dict:
    """BLOCK_H, TILE_N and launch parameters of stage 1 (see the module docstring)."""
    if interpreter_active():  # cost is per op, not per element: fewer, larger tiles
        return dict(BLOCK_H=max(16, min(64, triton.next_power_of_2(num_heads))), TILE_N=64,
                    num_warps=4, num_stages=1)
    if num_heads <= 16:
        return dict(BLOCK_H=16, TILE_N=32, num_warps=8, num_stages=3)
    if num_heads <= 32:
        return dict(BLOCK_H=32, TILE_N=16, num_warps=8, num_stages=3)
    return dict(BLOCK_H=64, TILE_N=16, num_warps=8, num_stages=3)


def mla_head_blocks(num_heads: int) -> int:
    """Stage-1 programs per (request, split): pass as choose_num_splits(num_kv_heads=...)."""
    return triton.cdiv(num_heads, _launch_config(num_heads)["BLOCK_H"])


def mla_decode_attention(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    out: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    num_splits: int,
    workspace: DecodeWorkspace | None = None,
    c_scale: torch.Tensor | float | None = None,
    pe_scale: torch.Tensor | float | None = None,
) -> None:
    """Absorbed MLA decode of q_nope [B, H, L], q_pe [B, H, R] over the paged latent cache
    kv_cache [num_blocks, block_size, L + R] into out [B, H, L].

    out[b, h] = softmax(scale · (q_nope·c + q_pe·k_pe)) @ c over keys 0 .. seq_lens[b] - 1
    (zeros when seq_lens[b] == 0). One launch when num_splits == 1; otherwise stage 1 writes fp32
    partials into `workspace` (a fresh one when None) and `merge_attn_states` combines them.
    An fp8 kv_cache is dequantized with c_scale / pe_scale (fp32 [1]; see the module docstring).
    """
    _check_inputs(q_nope, q_pe, kv_cache, out, seq_lens, block_table, num_splits)
    batch, num_heads, lora = q_nope.shape
    if batch == 0 or num_heads == 0:
        return
    scales = (None, None)
    if kv_cache.dtype == FP8_KV_DTYPE:
        scales = (_scale_arg(c_scale, q_nope), _scale_arg(pe_scale, q_nope))
    if num_splits == 1:
        _stage1(q_nope, q_pe, kv_cache, seq_lens, block_table, scale, 1, out, None, scales)
        return
    workspace = workspace if workspace is not None else DecodeWorkspace()
    p_out, p_lse = workspace.get(batch, num_heads, num_splits, lora, q_nope.device)
    _stage1(q_nope, q_pe, kv_cache, seq_lens, block_table, scale, num_splits, p_out, p_lse,
            scales)
    merge_attn_states(p_out, p_lse, out)


def _check_inputs(q_nope, q_pe, kv_cache, out, seq_lens, block_table, num_splits) -> None:
    """Shape/dtype/stride preconditions of the kernels, as ValueErrors."""
    named = dict(q_nope=q_nope, q_pe=q_pe, kv_cache=kv_cache, out=out)
    for name, t in named.items():
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D, got shape {tuple(t.shape)}")
    batch, num_heads, lora = q_nope.shape
    rope = q_pe.shape[-1]
    if q_pe.shape[:2] != (batch, num_heads):
        raise ValueError(f"q_pe {tuple(q_pe.shape)} must be [B, H, R] with q_nope's B, H "
                         f"{(batch, num_heads)}")
    if lora < 1 or rope < 1:
        raise ValueError(f"kv_lora_rank L={lora} and rope dim R={rope} must be >= 1")
    if kv_cache.shape[-1] != lora + rope:
        raise ValueError(f"kv_cache {tuple(kv_cache.shape)} must be [num_blocks, block_size, "
                         f"L + R = {lora + rope}]")
    if kv_cache.shape[1] < 1:
        raise ValueError("kv_cache block_size must be >= 1")
    if out.shape != q_nope.shape:
        raise ValueError(f"out {tuple(out.shape)} must match q_nope {tuple(q_nope.shape)}")
    dtypes = (torch.float16, torch.bfloat16, torch.float32)
    if kv_cache.dtype not in (*dtypes, FP8_KV_DTYPE) or out.dtype not in dtypes:
        raise ValueError(f"kv_cache must be fp16, bf16, fp32 or fp8 e4m3fn and out fp16, bf16 "
                         f"or fp32, got {kv_cache.dtype}, {out.dtype}")
    if kv_cache.dtype == FP8_KV_DTYPE:  # the dots run in the query's dtype
        if q_nope.dtype not in dtypes or q_pe.dtype != q_nope.dtype:
            raise ValueError(f"with an fp8 kv_cache q_nope ({q_nope.dtype}) and q_pe "
                             f"({q_pe.dtype}) must share one of fp16, bf16, fp32")
    elif q_nope.dtype != kv_cache.dtype or q_pe.dtype != kv_cache.dtype:
        raise ValueError(f"q_nope ({q_nope.dtype}) and q_pe ({q_pe.dtype}) must have "
                         f"kv_cache's dtype ({kv_cache.dtype})")
    if seq_lens.dtype != torch.int32 or seq_lens.shape != (batch,):
        raise ValueError(f"seq_lens must be int32 [B={batch}], got {seq_lens.dtype} "
                         f"{tuple(seq_lens.shape)}")
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"block_table must be int32 [B={batch}, max_blocks], got "
                         f"{block_table.dtype} {tuple(block_table.shape)}")
    for name, t in (*named.items(), ("block_table", block_table)):
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(f"{name} must be contiguous in its last dim (stride {t.stride()})")
    if not isinstance(num_splits, numbers.Integral) or num_splits < 1:
        raise ValueError(f"num_splits must be an int >= 1, got {num_splits!r}")
    devices = {t.device for t in (q_nope, q_pe, kv_cache, out, seq_lens, block_table)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    for name, t in named.items():
        check_dtype_supported(t, name)


def _stage1(q_nope, q_pe, kv_cache, seq_lens, block_table, scale, num_splits, o, lse,
            scales=(None, None)):
    """Launch the split kernel: o [B, H, L] when lse is None (direct), else partials
    [B, H, S, L] with lse [B, H, S]. scales: (c_scale, pe_scale) for an fp8 cache."""
    batch, num_heads, lora = q_nope.shape
    rope = q_pe.shape[-1]
    if lse is None:
        o_strides = (o.stride(0), o.stride(1), 0)
        l_strides = (0, 0, 0)
    else:
        o_strides = (o.stride(0), o.stride(1), o.stride(2))
        l_strides = tuple(lse.stride())
    cfg = _launch_config(num_heads)
    kv_fp8 = kv_cache.dtype == FP8_KV_DTYPE
    compute_dtype = q_nope.dtype if kv_fp8 else kv_cache.dtype
    precision = "ieee" if compute_dtype == torch.float32 else "tf32"
    c_scale, pe_scale = scales if kv_fp8 else (seq_lens, seq_lens)  # unused pointers
    grid = (triton.cdiv(num_heads, cfg["BLOCK_H"]), batch, num_splits)
    _mla_split_kernel[grid](
        q_nope, q_pe, kv_cache, seq_lens, block_table, o, lse if lse is not None else o,
        c_scale, pe_scale,
        scale * _LOG2E, num_heads,
        q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1),
        kv_cache.stride(0), kv_cache.stride(1),
        block_table.stride(0),
        *o_strides, *l_strides,
        NUM_SPLITS=num_splits, BLOCK_SIZE=kv_cache.shape[1], TILE_N=cfg["TILE_N"],
        BLOCK_H=cfg["BLOCK_H"], LORA=lora, BLOCK_L=max(16, triton.next_power_of_2(lora)),
        ROPE=rope, BLOCK_R=max(16, triton.next_power_of_2(rope)),
        STORE_LSE=lse is not None, DOT_PRECISION=precision, KV_FP8=kv_fp8,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )


def mla_decode_attention_ref(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    c_scale: torch.Tensor | float | None = None,
    pe_scale: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """PyTorch reference (fp32 math, one request at a time): out [B, H, L] in q_nope's dtype.
    An fp8 cache is dequantized first (kv_c part * c_scale, k_pe part * pe_scale)."""
    batch, num_heads, lora = q_nope.shape
    if kv_cache.dtype == FP8_KV_DTYPE:
        c_scale, pe_scale = _scale_arg(c_scale, q_nope), _scale_arg(pe_scale, q_nope)
    block_size = kv_cache.shape[1]
    out = torch.zeros(batch, num_heads, lora, dtype=torch.float32, device=q_nope.device)
    for b in range(batch):
        n = int(seq_lens[b])
        if n == 0:
            continue
        pos = torch.arange(n, device=kv_cache.device)
        rows = kv_cache[block_table[b].long()[pos // block_size], pos % block_size]
        c = dequantize_kv_ref(rows[:, :lora], c_scale)  # [n, L]
        kpe = dequantize_kv_ref(rows[:, lora:], pe_scale)  # [n, R]
        scores = (q_nope[b].float() @ c.T + q_pe[b].float() @ kpe.T) * scale  # [H, n]
        out[b] = torch.softmax(scores, dim=-1) @ c
    return out.to(q_nope.dtype)
