"""GPU kernel benchmark: each Triton kernel at the shapes of kernel-targets.md §5, checked against
its reference at that shape, timed, and compared with the measured machine ceilings and PyTorch.

    python -m lab.bench.kernels                 # needs CUDA; depends only on torch and triton
    python -m lab.bench.kernels --quick         # smaller shapes, for a smoke run
    python -m lab.bench.kernels --features      # only the attention-feature rows and their baselines

First it measures the ceilings (a large device copy: GB/s; a large bf16 matmul: TFLOP/s), then
prints one table: µs (median of many runs, `triton.testing.do_bench`), achieved GB/s or TFLOP/s,
% of the measured ceiling, and the same operation through PyTorch (SDPA for attention).
Working sets are larger than L2 (50 MB on H100/H200) except where the row is about small
launches (row 3, row 10).

Attention-feature rows (a layer's sliding window, sinks, soft cap: lab/attention/spec.py) beside
their plain rows 1 and 7: "1w" / "7w" a sliding window (work counted over the keys the window
lets each query see: the kernels skip the rest, so µs should follow the window, not the
context), "1s" / "7s" sinks, "1c" / "7c" a soft cap (the same work as rows 1 / 7: the overhead
is the difference), "1ws" gpt-oss's shape (window 128 with sinks, 64:8 heads, d64). Their torch
column is SDPA over the same keys (with the window's mask) without sinks or cap, which SDPA
lacks: a baseline of the attention work, not of the feature.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Setup:
    """Where the rows run: CUDA + bf16 for the real table; `--smoke` runs tiny shapes in fp32 on
    the CPU (Triton's interpreter) to check the script itself end to end."""

    device: str = "cuda"
    dtype: torch.dtype = torch.bfloat16

    def t(self, *shape, dtype=None) -> torch.Tensor:
        return torch.randn(*shape, device=self.device, dtype=dtype or self.dtype)


@dataclass
class Row:
    row: str
    name: str
    shape: str
    us: float
    work: float  # bytes (memory-bound rows) or FLOPs (compute-bound rows)
    unit: str  # "GB/s" or "TFLOP/s"
    torch_us: float | None
    ok: bool


def bench(fn: Callable[[], object]) -> float:
    """Median µs of fn over many runs (CUDA events); a plain timer on the CPU smoke run."""
    if not torch.cuda.is_available():
        import time

        start = time.perf_counter()
        fn()
        return 1e6 * (time.perf_counter() - start)
    from triton.testing import do_bench

    return 1e3 * do_bench(fn, warmup=25, rep=200, return_mode="median")


def copy_bandwidth() -> float:
    """Bytes per second of a 1 GiB device-to-device copy of random bytes, read + written
    (median over CUDA events): the memory ceiling here and in lab.bench.e2e's floor."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    return 2 * src.numel() / (bench(lambda: dst.copy_(src)) * 1e-6)


def ceilings() -> tuple[float, float]:
    """(copy GB/s, bf16 matmul TFLOP/s) measured on this device."""
    copy_gbs = copy_bandwidth() / 1e9
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_tflops = 2 * 8192**3 / bench(lambda: a @ b) / 1e6
    return copy_gbs, mm_tflops


# -- paged attention shapes ----------------------------------------------------------------------
def paged_setup(env: Setup, batch: int, ctx: int, h: int, hkv: int, d: int, bs: int,
                q_len: int = 1):
    """A scattered paged cache holding `ctx` tokens per request, and the step's queries."""
    nblk = math.ceil(ctx / bs)
    perm = torch.randperm(batch * nblk, device=env.device).int() + 1
    block_table = perm.view(batch, nblk)
    kv = env.t(2, batch * nblk + 1, bs, hkv, d)
    q = env.t(batch * q_len, h, d)
    seq_lens = torch.full((batch,), ctx, device=env.device, dtype=torch.int32)
    qsl = torch.arange(0, batch * q_len + 1, q_len, device=env.device, dtype=torch.int32)
    return q, kv, block_table, seq_lens, qsl


def dense_kv(kv, block_table, ctx: int):
    b = block_table.shape[0]
    k = kv[0][block_table.long()].reshape(b, -1, *kv.shape[-2:])[:, :ctx]
    v = kv[1][block_table.long()].reshape(b, -1, *kv.shape[-2:])[:, :ctx]
    return k.transpose(1, 2), v.transpose(1, 2)  # [B, Hkv, L, D]


def _feature_args(env: Setup, h: int, window: int | None, sinks: bool,
                  softcap: float | None) -> dict:
    """The kernels' feature keywords of a row (sinks: one fp32 logit per query head)."""
    kw = {}
    if window is not None:
        kw["sliding_window"] = window
    if sinks:
        kw["sinks"] = torch.randn(h, device=env.device, dtype=torch.float32)
    if softcap is not None:
        kw["softcap"] = softcap
    return kw


def _feature_label(window: int | None, sinks: bool, softcap: float | None) -> tuple[str, str]:
    """(a row name's feature words, the shape's feature fields)."""
    words = [w for w, on in (("SWA", window is not None), ("sinks", sinks),
                             ("cap", softcap is not None)) if on]
    fields = [f for f, on in ((f" W={window}", window is not None),
                              (f" cap={softcap:g}" if softcap else "", softcap is not None)) if on]
    return (" " + "+".join(words) if words else ""), "".join(fields)


def decode_row(env: Setup, row: str, batch: int, ctx: int, h=32, hkv=8, d=128, bs=16,
               kv_fp8: bool = False, window: int | None = None, sinks: bool = False,
               softcap: float | None = None) -> Row:
    """Paged decode; kv_fp8: the cache in float8 e4m3 with per-layer K/V scales (cache.dtype=fp8),
    GB/s counted on the fp8 bytes; the torch baseline attends over the dequantized cache. A
    sliding window / sinks / soft cap (the feature rows): GB/s over the keys the window shows,
    splits sized by them; the torch baseline is SDPA over those keys."""
    from lab.kernels.fp8_kv import calibrate_kv_scale, dequantize_kv_ref, quantize_kv_ref
    from lab.kernels.paged_decode import (
        DecodeWorkspace,
        choose_num_splits,
        paged_decode_attention,
        paged_decode_attention_ref,
    )

    q, kv, bt, seq_lens, _ = paged_setup(env, batch, ctx, h, hkv, d, bs)
    scales = {}
    if kv_fp8:
        ks, vs = calibrate_kv_scale(kv[0]), calibrate_kv_scale(kv[1])
        kv = torch.stack((quantize_kv_ref(kv[0], ks), quantize_kv_ref(kv[1], vs)))
        scales = dict(k_scale=ks, v_scale=vs)
    features = _feature_args(env, h, window, sinks, softcap)
    seen = min(ctx, window or ctx)  # the keys each query reads
    out = torch.empty_like(q)
    ws = DecodeWorkspace()
    sms = torch.cuda.get_device_properties(0).multi_processor_count if env.device == "cuda" else 8
    splits = choose_num_splits(batch, seen, num_sms=sms, num_kv_heads=hkv)
    scale = d**-0.5

    def run():
        paged_decode_attention(q, kv[0], kv[1], out, seq_lens, bt, scale, splits, ws, **scales,
                               **features)

    run()
    ref = torch.empty_like(q)
    paged_decode_attention_ref(q, kv[0], kv[1], ref, seq_lens, bt, scale, splits, **scales,
                               **features)
    ok = torch.allclose(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    if kv_fp8:  # the baseline reads the dequantized cache in the model dtype
        kv = torch.stack((dequantize_kv_ref(kv[0], scales["k_scale"]),
                          dequantize_kv_ref(kv[1], scales["v_scale"]))).to(q.dtype)
    k, v = dense_kv(kv, bt, ctx)
    k, v = k[:, :, ctx - seen:].contiguous(), v[:, :, ctx - seen:].contiguous()
    qd = q.view(batch, h, 1, d)
    t_torch = bench(lambda: F.scaled_dot_product_attention(qd, k, v, enable_gqa=True))
    nbytes = 2 * batch * seen * hkv * d * (1 if kv_fp8 else 2) + 2 * q.numel() * 2
    name = "paged decode fp8" if kv_fp8 else "paged decode"
    words, fields = _feature_label(window, sinks, softcap)
    return Row(row, f"{name}{words} (S={splits})", f"B={batch} ctx={ctx}{fields} {h}:{hkv} d{d} "
               f"bs{bs}", bench(run), nbytes, "GB/s", t_torch, ok)


def prefill_row(env: Setup, row: str, ctx: int, new: int, h=32, hkv=8, d=128, bs=16,
                window: int | None = None, sinks: bool = False,
                softcap: float | None = None) -> Row:
    """Paged prefill of `new` tokens after ctx - new cached ones; TFLOP/s over the (query, key)
    pairs the causal mask (and a sliding window) lets attend: the kernel skips the others."""
    from lab.kernels.paged_prefill import paged_attention, paged_attention_ref

    q, kv, bt, seq_lens, qsl = paged_setup(env, 1, ctx, h, hkv, d, bs, q_len=new)
    features = _feature_args(env, h, window, sinks, softcap)
    out = torch.empty_like(q)
    scale = d**-0.5

    def run():
        paged_attention(q, kv[0], kv[1], out, qsl, seq_lens, bt, new, scale, **features)

    run()
    ref = torch.empty_like(q)
    paged_attention_ref(q, kv[0], kv[1], ref, qsl, seq_lens, bt, new, scale, **features)
    ok = torch.allclose(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    prefix = ctx - new
    pos = torch.arange(prefix, ctx, dtype=torch.float64)  # the new tokens' positions
    pairs = float(torch.clamp(pos + 1, max=window or ctx).sum())  # keys each one sees
    flops = 4 * h * d * pairs  # QK^T and PV over the attended pairs
    k, v = dense_kv(kv, bt, ctx)
    qd = q.view(1, new, h, d).transpose(1, 2)
    mask = None if prefix == 0 and window is None else _causal_mask(new, ctx, env.device, window)
    t_torch = bench(lambda: F.scaled_dot_product_attention(
        qd, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=True))
    words, fields = _feature_label(window, sinks, softcap)
    return Row(row, f"paged prefill{words or ' (causal)'}",
               f"prefix={prefix} new={new}{fields} {h}:{hkv} d{d} bs{bs}", bench(run), flops,
               "TFLOP/s", t_torch, ok)


def _causal_mask(new: int, ctx: int, device: str, window: int | None = None) -> torch.Tensor:
    qpos = torch.arange(ctx - new, ctx, device=device)[:, None]
    keys = torch.arange(ctx, device=device)[None, :]
    mask = keys <= qpos
    return mask if window is None else mask & (keys > qpos - window)


def mla_row(env: Setup, row: str, batch: int, ctx: int, h: int, lora=512, rope=64, bs=64,
            unit="GB/s") -> Row:
    """Rows 5/6: absorbed MLA decode over a scattered latent cache [blocks, bs, L + R].

    GB/s counts the latent cache read + q + out; TFLOP/s counts QK (L + R wide) and PV (L wide).
    Torch: SDPA over the dense gathered latents, the H heads as the query rows of one KV head.
    """
    from lab.kernels.mla_decode import (
        DecodeWorkspace,
        mla_decode_attention,
        mla_decode_attention_ref,
        mla_head_blocks,
    )
    from lab.kernels.paged_decode import choose_num_splits

    nblk = math.ceil(ctx / bs)
    bt = (torch.randperm(batch * nblk, device=env.device).int() + 1).view(batch, nblk)
    cache = env.t(batch * nblk + 1, bs, lora + rope)
    q = env.t(batch, h, lora + rope)
    q_nope, q_pe = q[..., :lora], q[..., lora:]
    out = env.t(batch, h, lora)
    seq_lens = torch.full((batch,), ctx, device=env.device, dtype=torch.int32)
    sms = torch.cuda.get_device_properties(0).multi_processor_count if env.device == "cuda" else 8
    splits = choose_num_splits(batch, ctx, num_sms=sms, num_kv_heads=mla_head_blocks(h))
    scale = (128 + rope) ** -0.5  # DeepSeek: qk_nope_head_dim 128 + rope
    ws = DecodeWorkspace()

    def run():
        mla_decode_attention(q_nope, q_pe, cache, out, seq_lens, bt, scale, splits, ws)

    run()
    ref = mla_decode_attention_ref(q_nope, q_pe, cache, seq_lens, bt, scale)
    ok = torch.allclose(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    dense = cache[bt.long()].reshape(batch, 1, -1, lora + rope)[:, :, :ctx]  # [B, 1, ctx, L+R]
    v = dense[..., :lora].contiguous()
    qd = q.view(batch, 1, h, lora + rope)
    t_torch = bench(lambda: F.scaled_dot_product_attention(qd, dense, v, scale=scale))
    es = cache.element_size()
    work = (2 * batch * h * ctx * (lora + rope) + 2 * batch * h * ctx * lora if unit == "TFLOP/s"
            else (batch * ctx * (lora + rope) + q.numel() + out.numel()) * es)
    return Row(row, f"MLA decode (S={splits})", f"B={batch} ctx={ctx} h{h} L{lora}+R{rope} bs{bs}",
               bench(run), work, unit, t_torch, ok)


def kv_write_row(env: Setup, tokens=8192, hkv=8, d=128, bs=16) -> Row:
    from lab.kernels.kv_cache_write import write_kv_cache, write_kv_cache_ref

    nblk = tokens // bs
    kv = torch.zeros(2, nblk + 1, bs, hkv, d, device=env.device, dtype=env.dtype)
    k = env.t(tokens, hkv, d)
    v = torch.randn_like(k)
    slots = (torch.randperm(nblk, device=env.device) + 1).repeat_interleave(bs) * bs
    slots = slots + torch.arange(tokens, device=env.device) % bs
    run = lambda: write_kv_cache(k, v, kv[0], kv[1], slots)  # noqa: E731
    run()
    ref = torch.zeros_like(kv)
    write_kv_cache_ref(k, v, ref[0], ref[1], slots)
    ok = torch.equal(kv, ref)
    flat = kv[0].view(-1, hkv, d)
    t_torch = bench(lambda: flat.index_copy_(0, slots, k))
    return Row("8", "KV write", f"{tokens} tokens {hkv}x{d} bs{bs}", bench(run),
               4 * k.numel() * 2, "GB/s", 2 * t_torch, ok)


def rmsnorm_row(env: Setup, row: str, rows: int, hidden: int) -> Row:
    from lab.kernels.rmsnorm import rms_norm, rms_norm_ref

    x = env.t(rows, hidden)
    res = torch.randn_like(x)
    w = env.t(hidden)
    y, h = rms_norm(x, w, 1e-6, res)
    y_ref, h_ref = rms_norm_ref(x, w, 1e-6, res)
    ok = torch.allclose(y.float(), y_ref.float(), atol=3e-2, rtol=3e-2) and torch.equal(h, h_ref)
    t_torch = bench(lambda: rms_norm_ref(x, w, 1e-6, res))
    return Row(row, "RMSNorm + residual", f"{rows}x{hidden}",
               bench(lambda: rms_norm(x, w, 1e-6, res)), 4 * x.numel() * 2, "GB/s", t_torch, ok)


def silu_row(env: Setup, row: str, rows: int, inter: int) -> Row:
    from lab.kernels.silu_and_mul import silu_and_mul, silu_and_mul_ref

    x = env.t(rows, 2 * inter)
    ok = torch.allclose(silu_and_mul(x).float(), silu_and_mul_ref(x).float(), atol=3e-2, rtol=3e-2)
    return Row(row, "SiLU and mul", f"{rows}x{inter}", bench(lambda: silu_and_mul(x)),
               1.5 * x.numel() * 2, "GB/s", bench(lambda: silu_and_mul_ref(x)), ok)


def rotary_row(env: Setup, row: str, tokens: int, h=32, hkv=8, d=128) -> Row:
    from lab.kernels.rotary import rotary_embedding, rotary_embedding_ref

    pos = torch.randint(0, 4096, (tokens,), device=env.device)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=env.device).float() / d))
    ang = torch.arange(4096, device=env.device).float()[:, None] * inv[None]
    cos, sin = ang.cos(), ang.sin()
    q = env.t(tokens, h, d)
    k = env.t(tokens, hkv, d)
    qo, ko = rotary_embedding(pos, q.clone(), k.clone(), cos, sin, True)
    qr, kr = rotary_embedding_ref(pos, q.clone(), k.clone(), cos, sin, True)
    ok = torch.allclose(qo.float(), qr.float(), atol=3e-2) and torch.allclose(ko.float(), kr.float(), atol=3e-2)
    run = lambda: rotary_embedding(pos, q, k, cos, sin, True)  # noqa: E731
    t_torch = bench(lambda: rotary_embedding_ref(pos, q.clone(), k.clone(), cos, sin, True))
    return Row(row, "rotary (neox)", f"{tokens} tok {h}/{hkv} heads d{d}", bench(run),
               2 * (q.numel() + k.numel()) * 2, "GB/s", t_torch, ok)


# -- fused MoE (rows 19-21) ------------------------------------------------------------------------
def moe_setup(env: Setup, tokens: int, hidden: int, inter: int, experts: int, top_k: int):
    """Expert weights (scaled so activations stay O(1)) and a softmax top-k routing."""
    x = env.t(tokens, hidden)
    w13 = env.t(experts, 2 * inter, hidden) * hidden**-0.5
    w2 = env.t(experts, hidden, inter) * inter**-0.5
    logits = torch.randn(tokens, experts, device=env.device)
    topk_w, topk_ids = logits.softmax(-1).topk(top_k, dim=-1)
    return x, w13, w2, topk_w, topk_ids.int()


def moe_row(env: Setup, row: str, tokens: int, hidden=2048, inter=768, experts=128,
            top_k=8) -> Row:
    """Row 19 (prefill, TFLOP/s) or 20 (decode, GB/s over the weights of the touched experts);
    checked against `fused_moe_ref` (per-expert torch GEMMs), which is also the torch time."""
    from lab.kernels.fused_moe import fused_moe, fused_moe_ref

    args = moe_setup(env, tokens, hidden, inter, experts, top_k)
    out = fused_moe(*args)
    ref = fused_moe_ref(*args)
    ok = torch.allclose(out.float(), ref.float(), atol=3e-2, rtol=3e-2)
    t_torch = bench(lambda: fused_moe_ref(*args))
    shape = f"T={tokens} E={experts} top{top_k} h{hidden} I{inter}"
    if row == "20":  # memory-bound: every touched expert's w13 and w2 are read once
        touched = args[4].unique().numel()
        nbytes = touched * 3 * inter * hidden * args[1].element_size() + 2 * args[0].nbytes
        return Row(row, "fused MoE decode", shape, bench(lambda: fused_moe(*args)), nbytes,
                   "GB/s", t_torch, ok)
    flops = 2 * tokens * top_k * (hidden * 2 * inter + inter * hidden)
    return Row(row, "fused MoE prefill", shape, bench(lambda: fused_moe(*args)), flops,
               "TFLOP/s", t_torch, ok)


def moe_align_row(env: Setup, tokens=256, experts=128, top_k=8) -> Row:
    """Row 21: align/sort alone (µs; GB/s on ids read + sorted ids and block experts written)."""
    from lab.kernels.fused_moe import pick_config
    from lab.kernels.moe_align import moe_align, moe_align_ref

    ids = moe_setup(env, tokens, 16, 16, experts, top_k)[4]
    bm = pick_config(ids.numel(), experts, 2048, 768)["BLOCK_M"]
    out = moe_align(ids, experts, bm)
    ok = all(torch.equal(a, b) for a, b in zip(out, moe_align_ref(ids, experts, bm)))
    nbytes = ids.nbytes + out[0].nbytes + out[1].nbytes
    return Row("21", "MoE align (sort)", f"T={tokens} E={experts} top{top_k} BLOCK_M={bm}",
               bench(lambda: moe_align(ids, experts, bm)), nbytes, "GB/s",
               bench(lambda: moe_align_ref(ids, experts, bm)), ok)


# -- quantized GEMMs (rows 14, 16, 17, 18; "14i" = int8 W8A8) -----------------------------------
def scaled_gemm_row(env: Setup, row: str, m: int, n: int, k: int, kind: str) -> Row:
    """W8A8 with per-token activation and per-channel weight scales (kind "fp8" or "int8"),
    checked against its reference. Row 16 (small M) reports GB/s on the 1-byte weights, the
    others TFLOP/s. Torch: torch._scaled_mm (fp8, same scales) / torch._int_mm (int8, int32 out,
    no scaling), on CUDA only."""
    if kind == "fp8":
        from lab.kernels.fp8_gemm import fp8_gemm as gemm
        from lab.kernels.fp8_gemm import fp8_gemm_ref as gemm_ref
        from lab.kernels.quantize import quantize_fp8_per_token as quant
    else:
        from lab.kernels.int8_gemm import int8_gemm as gemm
        from lab.kernels.int8_gemm import int8_gemm_ref as gemm_ref
        from lab.kernels.quantize import quantize_int8_per_token as quant
    a_q, a_s = quant(env.t(m, k))
    w_q, w_s = quant(env.t(n, k))
    w_s = w_s.reshape(n)
    run = lambda: gemm(a_q, a_s, w_q, w_s, None, env.dtype)  # noqa: E731
    out = run()
    ref = gemm_ref(a_q, a_s, w_q, w_s, None, env.dtype)
    ok = torch.allclose(out.float(), ref.float(), atol=3e-2, rtol=3e-2)
    t_torch = None
    if env.device == "cuda" and kind == "fp8" and hasattr(torch, "_scaled_mm"):
        t_torch = bench(lambda: torch._scaled_mm(a_q, w_q.T, scale_a=a_s, scale_b=w_s[None],
                                                 out_dtype=env.dtype))
    elif env.device == "cuda" and kind == "int8" and m > 16:
        t_torch = bench(lambda: torch._int_mm(a_q, w_q.T))
    shape = f"M={m} N={n} K={k} {kind}"
    if row == "16":
        nbytes = n * k + m * k + m * n * out.element_size()
        return Row(row, f"{kind} W8A8 GEMM (small M)", shape, bench(run), nbytes, "GB/s",
                   t_torch, ok)
    return Row(row, f"{kind} W8A8 GEMM", shape, bench(run), 2 * m * n * k, "TFLOP/s", t_torch, ok)


def w4a16_row(env: Setup, row: str, m: int, n: int, k: int, group: int = 128) -> Row:
    """Rows 17 (small M: GB/s on the packed int4 weights + scales) and 18 (TFLOP/s): asymmetric
    g128 weights, checked against `w4a16_gemm_ref`; torch = the 16-bit GEMM on dense weights."""
    from lab.kernels.w4a16_gemm import quantize_w4, w4a16_gemm, w4a16_gemm_ref

    x = env.t(m, k)
    packed, s, z = quantize_w4(env.t(n, k, dtype=torch.float32), group, symmetric=False)
    s = s.to(env.dtype)
    run = lambda: w4a16_gemm(x, packed, s, z, group)  # noqa: E731
    out = run()
    ref = w4a16_gemm_ref(x, packed, s, z, group)
    ok = torch.allclose(out.float(), ref.float(), atol=5e-2, rtol=3e-2)
    dense = env.t(n, k)
    t_torch = bench(lambda: F.linear(x, dense))
    shape = f"M={m} N={n} K={k} g{group}"
    if row == "17":
        nbytes = packed.nbytes + s.nbytes + z.nbytes + x.nbytes + out.nbytes
        return Row(row, "W4A16 GEMM (small M)", shape, bench(run), nbytes, "GB/s", t_torch, ok)
    return Row(row, "W4A16 GEMM", shape, bench(run), 2 * m * n * k, "TFLOP/s", t_torch, ok)


def feature_rows(env: Setup, quick: bool, baselines: bool = False) -> list[Row]:
    """The attention-feature rows (module docstring); `baselines`: rows 1 and 7 (8k) first,
    the plain kernels at the same shapes."""
    s = 4 if quick else 1
    rows = ([decode_row(env, "1", 64 // s, 4096), prefill_row(env, "7", 8192 // s, 8192 // s)]
            if baselines else [])
    rows += [decode_row(env, "1w", 16 // s, 32768 // s, window=4096),
             decode_row(env, "1s", 64 // s, 4096, sinks=True),
             decode_row(env, "1c", 64 // s, 4096, softcap=50.0),
             decode_row(env, "1ws", 64 // s, 4096, h=64, hkv=8, d=64, window=128, sinks=True)]
    # 8k (not 16k): the reference materialises [H, new, ctx] fp32 scores
    rows += [prefill_row(env, "7w", 8192 // s, 8192 // s, window=1024),
             prefill_row(env, "7s", 8192 // s, 8192 // s, sinks=True),
             prefill_row(env, "7c", 8192 // s, 8192 // s, softcap=50.0)]
    return rows


def all_rows(env: Setup, quick: bool) -> list[Row]:
    s = 4 if quick else 1
    rows = [decode_row(env, "1", 64 // s, 4096), decode_row(env, "2", 1, 32768 // s)]
    rows += [decode_row(env, "3", b, 1024) for b in (1, 4, 8)]
    rows += [decode_row(env, "4", 64 // s, 4096, kv_fp8=True)]
    rows += [mla_row(env, "5", 64 // s, 4096, h=16),
             mla_row(env, "6", 64 // s, 4096, h=128, unit="TFLOP/s")]
    rows += [prefill_row(env, "7", 8192 // s, 8192 // s), prefill_row(env, "7", 16384 // s, 16384 // s),
             prefill_row(env, "7", 8192 // s, 4096 // s)]
    rows += [kv_write_row(env, 8192 // s), rmsnorm_row(env, "9", 8192 // s, 4096),
             rmsnorm_row(env, "10", 256, 4096), silu_row(env, "10", 256, 14336),
             rotary_row(env, "10", 256), silu_row(env, "11", 8192 // s, 14336)]
    rows += [scaled_gemm_row(env, "14", 8192 // s, 8192, 4096, "fp8"),
             scaled_gemm_row(env, "14i", 8192 // s, 8192, 4096, "int8"),
             scaled_gemm_row(env, "16", 16, 14336, 4096, "fp8")]
    rows += [w4a16_row(env, "17", mm, 14336, 4096) for mm in (1, 16)]
    rows += [w4a16_row(env, "18", 512, 14336, 4096)]
    rows += [moe_row(env, "19", 16384 // s), moe_row(env, "20", 64), moe_align_row(env, 256)]
    return rows + feature_rows(env, quick)


def smoke_rows(env: Setup) -> list[Row]:
    """Every row function at tiny shapes (checks the script, not the speed)."""
    return [decode_row(env, "1", 2, 40, h=4, hkv=2, d=16, bs=4),
            decode_row(env, "4", 2, 40, h=4, hkv=2, d=16, bs=4, kv_fp8=True),
            mla_row(env, "5", 2, 40, h=4, lora=24, rope=8, bs=4),
            mla_row(env, "6", 2, 40, h=20, lora=16, rope=8, bs=4, unit="TFLOP/s"),
            prefill_row(env, "7", 24, 16, h=4, hkv=2, d=16, bs=4),
            decode_row(env, "1w", 2, 40, h=4, hkv=2, d=16, bs=4, window=9),
            decode_row(env, "1ws", 2, 40, h=4, hkv=2, d=16, bs=4, window=5, sinks=True,
                       softcap=2.0),
            prefill_row(env, "7w", 40, 24, h=4, hkv=2, d=16, bs=4, window=7),
            prefill_row(env, "7c", 24, 16, h=4, hkv=2, d=16, bs=4, sinks=True, softcap=2.0),
            kv_write_row(env, 32, hkv=2, d=16, bs=4), rmsnorm_row(env, "9", 8, 64),
            silu_row(env, "11", 8, 48), rotary_row(env, "10", 8, h=4, hkv=2, d=16),
            moe_row(env, "19", 12, hidden=32, inter=24, experts=4, top_k=2),
            moe_row(env, "20", 3, hidden=32, inter=24, experts=4, top_k=2),
            moe_align_row(env, 8, experts=4, top_k=2),
            scaled_gemm_row(env, "14i", 5, 40, 48, "int8"),  # fp8 rows: GPU only
            w4a16_row(env, "17", 3, 40, 64, group=32), w4a16_row(env, "18", 20, 24, 96, group=48)]


def print_table(rows: list[Row], copy_gbs: float, mm_tflops: float) -> None:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU (smoke run)"
    print(f"\n{gpu}: measured copy {copy_gbs:.0f} GB/s, bf16 matmul {mm_tflops:.0f} TFLOP/s")
    print(f"{'row':<4}{'kernel':<34}{'shape':<42}{'µs':>9}{'achieved':>16}{'% ceil':>8}"
          f"{'torch µs':>10}{'ok':>5}")
    for r in rows:
        rate = r.work / r.us / (1e3 if r.unit == "GB/s" else 1e6)
        ceil = copy_gbs if r.unit == "GB/s" else mm_tflops
        t = "-" if r.torch_us is None else f"{r.torch_us:.1f}"
        print(f"{r.row:<4}{r.name:<34}{r.shape:<42}{r.us:>9.1f}{rate:>10.1f} {r.unit:<5}"
              f"{100 * rate / ceil:>8.1f}{t:>10}{'yes' if r.ok else 'NO':>5}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller shapes")
    p.add_argument("--features", action="store_true",
                   help="only the attention-feature rows, after their plain baselines (1, 7)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny shapes in fp32 on the CPU interpreter: checks the script only")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    if args.smoke:
        print_table(smoke_rows(Setup("cpu", torch.float32)), 1.0, 1.0)
        return
    if not torch.cuda.is_available():
        raise SystemExit("lab.bench.kernels needs CUDA (the Triton interpreter is not a "
                         "benchmark); --smoke checks the script on the CPU")
    copy_gbs, mm_tflops = ceilings()
    rows = (feature_rows(Setup(), args.quick, baselines=True) if args.features
            else all_rows(Setup(), args.quick))
    print_table(rows, copy_gbs, mm_tflops)


if __name__ == "__main__":
    main()
