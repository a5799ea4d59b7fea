"""Fused mixture-of-experts: routed experts of a MoE layer as two grouped GEMMs (Triton + PyTorch
reference). Contract of `fused_moe` / `fused_moe_ref` (HF DeepseekV2/V3 MoE numerics):

    x [T, hidden], w13 [E, 2I, hidden] (rows | gate (I) | up (I) |), w2 [E, hidden, I],
    topk_weights / topk_ids [T, k]:
    out[t] = sum_j topk_weights[t, j] * w2[e] (silu(gate) * up),  (gate | up) = w13[e] x[t],
    e = topk_ids[t, j]; out [T, hidden] in x's dtype.

8-bit expert weights (`w13_scale` [E, 2I], `w2_scale` [E, hidden], fp32): w13 / w2 then hold int8
or float8_e4m3fn values with one scale per expert and output channel, W = w * scale[:, :, None];
the kernel converts each weight tile to x's dtype (exact for both) and multiplies the fp32
accumulator by the column's scale once after the K loop (the scale factors out of the sum).

Data flow (n = T*k (token, expert) pairs, pair i = t*k + j; no host sync anywhere):

    topk_ids [T, k] --moe_align--> sorted_token_ids (pairs grouped by expert, each expert padded
        |                          to BLOCK_M with the sentinel n), expert_ids per BLOCK_M block
        v
    GEMM 1 (gather):  cache1[i] = x[i // k] @ w13[e]^T            [n, 2I]   (x.dtype)
        v
    silu_and_mul:     cache2[i] = silu(gate) * up                 [n, I]    (silu_and_mul.py)
        v
    GEMM 2 (weight):  cache3[i] = topk_weights[i] * cache2[i] @ w2[e]^T   [n, hidden]
        v
    sum over k:       out[t] = sum_j cache3[t*k + j]              [T, hidden]

One kernel serves both GEMMs. Grid: 1-D over (BLOCK_M blocks of the alignment, host-side upper
bound) x cdiv(N, BLOCK_N), GROUP_M-swizzled so consecutive programs reuse the same expert's
weight tiles from L2. A program whose block starts past num_tokens_post_padded returns at once;
otherwise all its rows belong to expert_ids[block]. It gathers its A rows through the sorted pair
ids (GEMM 1: row i // k of x; GEMM 2: row i of cache2; padding rows read row 0 and are never
stored), walks K in BLOCK_K steps (masked only when K % BLOCK_K != 0; out-of-range N columns are
wrapped with % N so loads stay unmasked) with fp32 accumulation, optionally scales each row by
its routing weight, and scatters the tile to rows i of the output. Tiles by tokens per expert
(`pick_config`).

Rounding: cache1, cache2 and cache3 are rounded to x's dtype (HF rounds the expert projections
the same way; the weighted terms are rounded once more before the sum, HF sums them in fp32).
Memory: the caches hold n * (2I + I + hidden) elements (T=16384, top-8, I=768, hidden 2048, bf16:
1.1 GB); callers bound T per call (chunked prefill) to bound it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from lab.kernels import check_dtype_supported, interpreter_active
from lab.kernels.moe_align import max_num_blocks, moe_align
from lab.kernels.silu_and_mul import silu_and_mul
from lab.kernels.tiles import grouped_tile, load_k_step


@triton.jit
def _moe_gemm_kernel(
    a_ptr, b_ptr, c_ptr, w_ptr, s_ptr,
    sorted_ptr, expert_ids_ptr, num_post_ptr,
    N, K, num_pairs, num_blocks_m,
    stride_am, stride_be, stride_bn, stride_cm, stride_se,
    TOP_K: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    B_SCALED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """C[i, n] = (w[i] *) (s[e, n] *) sum_k A[i // TOP_K, k] * B[e, n, k] for the BLOCK_M pairs i
    of one block of sorted_token_ids (expert e) and BLOCK_N columns n; with B_SCALED, B holds
    8-bit values and s their per-channel scales. Last dims of A, B, C are contiguous."""
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = grouped_tile(pid, num_blocks_m, num_n, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(num_post_ptr):
        return

    pair = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    row_ok = pair < num_pairs
    a_row = tl.where(row_ok, pair // TOP_K, 0).to(tl.int64)  # padding rows read row 0
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_row[:, None] * stride_am + offs_k[None, :]
    b_ptrs = (b_ptr + expert * stride_be + (offs_n % N).to(tl.int64)[None, :] * stride_bn
              + offs_k[:, None])  # [BLOCK_K, BLOCK_N] tile of B[e]^T
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for kk in range(0, tl.cdiv(K, BLOCK_K)):
        a, b = load_k_step(a_ptrs, b_ptrs, K - kk * BLOCK_K, offs_k, EVEN_K)
        if B_SCALED:
            b = b.to(a.dtype)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if B_SCALED:
        acc = acc * tl.load(s_ptr + expert * stride_se + offs_n % N)[None, :]
    if MUL_ROUTED_WEIGHT:
        acc = acc * tl.load(w_ptr + pair, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    c_ptrs = c_ptr + pair.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_n < N)[None, :])


def pick_config(num_pairs: int, num_experts: int, n: int, k: int, elem_size: int = 2) -> dict:
    """Tiles and launch options for H100/H200 (sm_90), keyed by the mean tokens per expert.

    Decode (<= 16 per expert, e.g. T=64, top-8 of 128): BLOCK_M 16, long BLOCK_K for wide weight
    loads; the step is bound by the bandwidth of the touched experts' weights. Up to 64 per
    expert: BLOCK_M 32. Prefill: 64 x 128 x 64 (4 warps, 4 stages) and 128 x 128 x 64 (8 warps,
    3 stages) past 512 per expert, GROUP_M 8 so a group of M blocks (mostly one expert) shares
    each weight tile through L2. fp32 (a GPU test dtype) halves BLOCK_K and uses 3 stages.
    `n`, `k` (the GEMM's N and K) only cap the tiles for small layers.
    """
    per_expert = num_pairs / max(1, num_experts)
    if per_expert <= 16:
        cfg = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=4)
    elif per_expert <= 64:
        cfg = dict(BLOCK_M=32, BLOCK_N=128, BLOCK_K=64, GROUP_M=4, num_warps=4, num_stages=4)
    elif per_expert <= 512:
        cfg = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4)
    else:
        cfg = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
    if elem_size > 2:
        cfg["BLOCK_K"] //= 2
        cfg["num_stages"] = 3
    cfg["BLOCK_N"] = min(cfg["BLOCK_N"], max(16, triton.next_power_of_2(n)))
    cfg["BLOCK_K"] = min(cfg["BLOCK_K"], max(16, triton.next_power_of_2(k)))
    return cfg


def _interpreter_config(n: int, k: int) -> dict:
    """Few, large tiles (the interpreter's cost is per op, not per element); BLOCK_M 16 keeps
    the padding rows of tiny test routings few."""
    return dict(BLOCK_M=16, BLOCK_N=min(128, max(16, triton.next_power_of_2(n))),
                BLOCK_K=min(128, max(16, triton.next_power_of_2(k))), GROUP_M=1,
                num_warps=4, num_stages=1)


EXPERT_WEIGHT_DTYPES = (torch.int8, torch.float8_e4m3fn)  # 8-bit expert weights (with scales)


def _check_args(x, w13, w2, topk_weights, topk_ids, w13_scale=None, w2_scale=None) -> None:
    """Shapes, dtypes, devices and layouts, as ValueErrors naming the argument."""
    if x.dim() != 2:
        raise ValueError(f"x must be [T, hidden], got shape {tuple(x.shape)}")
    t, hidden = x.shape
    if w13.dim() != 3 or w13.shape[2] != hidden or w13.shape[1] % 2:
        raise ValueError(f"w13 must be [E, 2*I, hidden={hidden}], got shape {tuple(w13.shape)}")
    e, inter = w13.shape[0], w13.shape[1] // 2
    if w2.shape != (e, hidden, inter):
        raise ValueError(f"w2 must be [E={e}, hidden={hidden}, I={inter}], got shape "
                         f"{tuple(w2.shape)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != t:
        raise ValueError(f"topk_ids must be [T={t}, k], got shape {tuple(topk_ids.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_weights {tuple(topk_weights.shape)} must match topk_ids "
                         f"{tuple(topk_ids.shape)}")
    if not topk_weights.is_floating_point():
        raise ValueError(f"topk_weights must be floating point, got {topk_weights.dtype}")
    if topk_ids.shape[1] > e:
        raise ValueError(f"topk_ids has k={topk_ids.shape[1]} > E={e} experts per token")
    if (w13_scale is None) != (w2_scale is None):
        raise ValueError("w13_scale and w2_scale go together (8-bit experts) or not at all")
    for name, w, scale in (("w13", w13, w13_scale), ("w2", w2, w2_scale)):
        if scale is None and w.dtype != x.dtype:
            raise ValueError(f"{name} dtype {w.dtype} must match x dtype {x.dtype}")
        if scale is not None:
            if w.dtype not in EXPERT_WEIGHT_DTYPES:
                raise ValueError(f"{name} with a scale must be int8 or float8_e4m3fn, got {w.dtype}")
            if scale.shape != w.shape[:2] or scale.dtype != torch.float32:
                raise ValueError(f"{name}_scale must be fp32 {tuple(w.shape[:2])}, got "
                                 f"{scale.dtype} {tuple(scale.shape)}")
            if scale.device != x.device or scale.stride(-1) != 1:
                raise ValueError(f"{name}_scale must be on {x.device}, contiguous per expert")
        if w.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dim (stride {w.stride()})")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"x must be fp32, fp16 or bf16, got {x.dtype}")
    for name, v in (("w13", w13), ("w2", w2), ("topk_weights", topk_weights),
                    ("topk_ids", topk_ids)):
        if v.device != x.device:
            raise ValueError(f"{name} is on {v.device}, x on {x.device}")


def _grouped_gemm(a, b, c, weights, scale, sorted_ids, expert_ids, num_post, top_k, cfg) -> None:
    """c[i] = (weights[i] *) a[i // top_k] @ (scale[e] *) b[e]^T over the aligned blocks."""
    n, k = b.shape[1], b.shape[2]
    num_blocks_m = expert_ids.numel()
    grid = (num_blocks_m * triton.cdiv(n, cfg["BLOCK_N"]),)
    _moe_gemm_kernel[grid](
        a, b, c, weights if weights is not None else c, scale if scale is not None else c,
        sorted_ids, expert_ids, num_post,
        n, k, c.shape[0], num_blocks_m,
        a.stride(0), b.stride(0), b.stride(1), c.stride(0),
        scale.stride(0) if scale is not None else 0,
        TOP_K=top_k,
        MUL_ROUTED_WEIGHT=weights is not None,
        B_SCALED=scale is not None,
        EVEN_K=k % cfg["BLOCK_K"] == 0,
        # fp32: 3-pass tf32 on tensor cores (~fp32 accurate); ignored for 16-bit inputs
        DOT_PRECISION="tf32x3" if a.dtype == torch.float32 else "tf32",
        **cfg,
    )


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    *,
    config: dict | None = None,
) -> torch.Tensor:
    """Routed experts (Triton); same contract as `fused_moe_ref` (module docstring).

    topk_ids must lie in [0, E) (not checked: that would sync). `config` overrides entries of
    the tile choice (BLOCK_M, BLOCK_N, BLOCK_K: powers of two >= 16; GROUP_M; num_warps;
    num_stages) for tests and tuning.
    """
    _check_args(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale)
    check_dtype_supported(x, "fused_moe x")
    t, hidden = x.shape
    e, two_i = w13.shape[0], w13.shape[1]
    top_k = topk_ids.shape[1]
    n_pairs = t * top_k
    if n_pairs == 0:
        return torch.zeros_like(x)
    x = x if x.stride(-1) == 1 else x.contiguous()
    if interpreter_active():
        cfg = _interpreter_config(max(two_i, hidden), max(hidden, two_i // 2))
    else:
        cfg = pick_config(n_pairs, e, max(two_i, hidden), min(hidden, two_i // 2), x.element_size())
    cfg.update(config or {})
    for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        if cfg[key] < 16 or cfg[key] & (cfg[key] - 1):
            raise ValueError(f"config {key} must be a power of two >= 16, got {cfg[key]}")
    sorted_ids, expert_ids, num_post = moe_align(topk_ids, e, cfg["BLOCK_M"])
    assert expert_ids.numel() == max_num_blocks(n_pairs, e, cfg["BLOCK_M"])
    weights = topk_weights.reshape(-1)
    weights = weights if weights.is_contiguous() else weights.contiguous()

    cache1 = torch.empty(n_pairs, two_i, dtype=x.dtype, device=x.device)
    _grouped_gemm(x, w13, cache1, None, w13_scale, sorted_ids, expert_ids, num_post, top_k, cfg)
    cache2 = silu_and_mul(cache1)
    del cache1
    cache3 = torch.empty(n_pairs, hidden, dtype=x.dtype, device=x.device)
    _grouped_gemm(cache2, w2, cache3, weights, w2_scale, sorted_ids, expert_ids, num_post, 1, cfg)
    if top_k == 1:
        return cache3
    return cache3.view(t, top_k, hidden).sum(1)


def fused_moe_ref(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """PyTorch reference (HF DeepseekV2/V3 MoE numerics), looping over the experts that got tokens.
    With scales, the 8-bit weights are dequantized per expert (w.to(x.dtype) * scale).

    x [T, hidden]; w13 [E, 2*I, hidden] (rows | gate (I) | up (I) |); w2 [E, hidden, I];
    topk_weights [T, k] (float32 or x.dtype); topk_ids [T, k] int (int32/int64).
    out[t] = sum_j topk_weights[t, j] * (w2[e] @ (silu(gate) * up)),  e = topk_ids[t, j],
    with (gate | up) = w13[e] @ x[t]. Returns [T, hidden] in x.dtype.
    """
    n_tok, hidden = x.shape
    inter = w2.shape[-1]
    # HF accumulates in topk_weights' dtype (fp32 router weights) and rounds once at the end.
    acc_dtype = torch.promote_types(x.dtype, topk_weights.dtype)
    out = torch.zeros((n_tok, hidden), dtype=acc_dtype, device=x.device)
    if n_tok == 0 or topk_ids.numel() == 0:
        return out.to(x.dtype)
    flat_ids = topk_ids.reshape(-1).long()
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()
    tok_of = order // topk_ids.shape[1]
    w_sorted = topk_weights.reshape(-1)[order]
    start = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        toks = tok_of[start : start + c]
        gate_up = F.linear(x[toks], _expert_weight(w13, w13_scale, e, x.dtype))
        h = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        y = F.linear(h, _expert_weight(w2, w2_scale, e, x.dtype))
        out.index_add_(0, toks, (y * w_sorted[start : start + c, None]).to(acc_dtype))
        start += c
    return out.to(x.dtype)


def _expert_weight(w: torch.Tensor, scale: torch.Tensor | None, e: int, dtype: torch.dtype):
    """Expert e's dense weight: as stored, or 8-bit values times their per-channel scales."""
    if scale is None:
        return w[e]
    return (w[e].to(torch.float32) * scale[e][:, None]).to(dtype)
