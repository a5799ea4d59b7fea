"""fp8 (e4m3fn) KV cache: every KV-write and attention kernel with an fp8 cache vs its reference,
plus CPU checks of the quantize / dequantize math (lab/kernels/fp8_kv.py).

Writes must be bit-identical to the references (same IEEE division, clamp and round-to-nearest-
even); attention kernels compare with fp32 queries (interpreter on CPU; "ieee" dots) against the
references, which dequantize the cache first.
"""


import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lab.kernels  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before kernel modules load)
from lab.attention.base import kv_cache_torch_dtype
from lab.kernels.fp8_kv import (
    FP8_KV_DTYPE,
    KV_SCALE_HEADROOM,
    calibrate_kv_scale,
    dequantize_kv_ref,
    quantize_kv_ref,
)
from lab.kernels.kv_cache_write import write_kv_cache, write_kv_cache_ref
from lab.kernels.mla_cache_write import write_latent_cache, write_latent_cache_ref
from lab.kernels.mla_decode import mla_decode_attention, mla_decode_attention_ref
from lab.kernels.paged_decode import paged_decode_attention, paged_decode_attention_ref
from lab.kernels.paged_prefill import paged_attention, paged_attention_ref
from tests.kernels.sm90 import compile_for_sm90

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(atol=2e-4, rtol=2e-4)  # fp32 queries: only summation order differs


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def _scale(x: torch.Tensor, kind: str) -> torch.Tensor:
    """A calibrated (power-of-two) scale, an arbitrary one, or one small enough to saturate."""
    if kind == "calibrated":
        return calibrate_kv_scale(x)
    amax = x.abs().max().item()
    value = amax / 300.0 if kind == "arbitrary" else amax / 2000.0  # "saturating"
    return torch.tensor([value], dtype=torch.float32, device=x.device)


# -- quantize / dequantize math (CPU, no kernels) ------------------------------------------------
def test_calibrated_scale_is_power_of_two_with_headroom():
    for amax in (1e-3, 0.37, 1.0, 3.5, 448.0, 1e4):
        x = torch.tensor([amax, -amax / 3])
        s = calibrate_kv_scale(x).item()
        assert s == 2.0 ** round(torch.log2(torch.tensor(s)).item())
        room = 448.0 * s / amax  # how far above amax the fp8 range reaches
        assert KV_SCALE_HEADROOM <= room < 2 * KV_SCALE_HEADROOM + 1e-6, (amax, s, room)


def test_quantize_round_trip_error():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=gen) * 3
    s = calibrate_kv_scale(x)
    q = quantize_kv_ref(x, s)
    assert q.dtype == FP8_KV_DTYPE
    back = dequantize_kv_ref(q, s)
    normal = x.abs() >= s * 2.0**-6  # e4m3 normals: 3 mantissa bits, relative error <= 2^-4
    assert torch.all((back - x).abs()[normal] <= x.abs()[normal] * 2.0**-4)
    assert torch.all((back - x).abs()[~normal] <= s * 2.0**-10)  # subnormal spacing / 2
    # saturation: clamp to +-448 * scale, never inf/nan
    big = quantize_kv_ref(torch.tensor([1e6, -1e6]), torch.tensor([1.0]))
    assert big.float().tolist() == [448.0, -448.0]


def test_cache_dtype_names():
    assert kv_cache_torch_dtype("fp8", torch.float32) == FP8_KV_DTYPE
    assert kv_cache_torch_dtype("auto", torch.float16) == torch.float16
    with pytest.raises(ValueError, match="cache.dtype"):
        kv_cache_torch_dtype("int4", torch.float32)


# -- writes: bit-exact ---------------------------------------------------------------------------
@settings(max_examples=6, deadline=None)
@given(
    block_size=st.sampled_from([1, 4, 16]),
    num_kv_heads=st.integers(1, 3),
    head_dim=st.sampled_from([16, 32]),
    num_tokens=st.integers(1, 30),
    src_dtype=st.sampled_from([torch.float32, torch.float16]),
    kind=st.sampled_from(["calibrated", "arbitrary", "saturating"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_kv_write_fp8_bit_exact(block_size, num_kv_heads, head_dim, num_tokens, src_dtype, kind,
                                seed):
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 2 + -(-num_tokens // block_size)
    k = (torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen) * 4).to(src_dtype)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(src_dtype)
    k[0, 0, 0] = 125.6  # rounds up across a binade: the interpreter's fp8 cast alone gets it wrong
    slots = torch.randperm((num_blocks - 1) * block_size, generator=gen)[:num_tokens] + block_size
    slots[1::3] = -1
    k, v, slots = k.to(DEVICE), v.to(DEVICE), slots.to(DEVICE)
    ks, vs = _scale(k.float(), kind), _scale(v.float(), kind)
    sentinel = torch.full((2, num_blocks, block_size, num_kv_heads, head_dim), -3.0,
                          device=DEVICE).to(FP8_KV_DTYPE)
    got, want = sentinel.clone(), sentinel.clone()
    write_kv_cache(k, v, got[0], got[1], slots, ks, vs)
    write_kv_cache_ref(k, v, want[0], want[1], slots, ks, vs)
    assert torch.equal(_bits(got), _bits(want))
    assert not torch.equal(_bits(got), _bits(sentinel))


@settings(max_examples=5, deadline=None)
@given(
    num_tokens=st.integers(1, 20),
    lora=st.sampled_from([16, 24]),
    rope=st.sampled_from([8, 16]),
    kind=st.sampled_from(["calibrated", "arbitrary", "saturating"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_latent_write_fp8_bit_exact(num_tokens, lora, rope, kind, seed):
    gen = torch.Generator().manual_seed(seed)
    block_size, num_blocks = 4, 2 + -(-num_tokens // 4)
    kv_c = torch.randn(num_tokens, lora, generator=gen).to(DEVICE)
    k_pe = (torch.randn(num_tokens, rope, generator=gen) * 10).to(DEVICE)
    slots = torch.randperm((num_blocks - 1) * block_size, generator=gen)[:num_tokens] + block_size
    slots[1::4] = -1
    slots = slots.to(DEVICE)
    cs, ps = _scale(kv_c, kind), _scale(k_pe, kind)
    cache = torch.zeros(num_blocks, block_size, lora + rope, device=DEVICE).to(FP8_KV_DTYPE)
    got, want = cache.clone(), cache.clone()
    write_latent_cache(kv_c, k_pe, got, slots, cs, ps)
    write_latent_cache_ref(want, kv_c, k_pe, slots, cs, ps)
    assert torch.equal(_bits(got), _bits(want))


# -- attention over an fp8 cache -----------------------------------------------------------------
def _paged_fp8(lens, block_size, hkv, d, gen):
    """A scattered fp8 paged cache holding each request's K/V; returns cache, table, scales."""
    nblk = [-(-n // block_size) for n in lens]
    num_blocks = 1 + sum(nblk) + 1
    phys = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    table = torch.zeros(len(lens), max(nblk) + 1, dtype=torch.int32)
    cache = torch.full((2, num_blocks, block_size, hkv, d), float("nan")).to(FP8_KV_DTYPE)
    ks, vs = torch.tensor([2.0**-5]), torch.tensor([2.0**-6])
    for b, (n, m) in enumerate(zip(lens, nblk)):
        table[b, :m] = torch.tensor(phys[:m], dtype=torch.int32)
        phys = phys[m:]
        pos = torch.arange(n)
        slots = table[b, pos // block_size].long() * block_size + pos % block_size
        write_kv_cache_ref(torch.randn(n, hkv, d, generator=gen) * 3,
                           torch.randn(n, hkv, d, generator=gen), cache[0], cache[1], slots,
                           ks, vs)
    return cache.to(DEVICE), table.to(DEVICE), ks.to(DEVICE), vs.to(DEVICE)


@settings(max_examples=5, deadline=None)
@given(
    lens=st.lists(st.integers(1, 70), min_size=1, max_size=3),
    block_size=st.sampled_from([4, 16]),
    hkv=st.integers(1, 2),
    group=st.sampled_from([1, 4]),
    num_splits=st.sampled_from([1, 3]),
    seed=st.integers(0, 2**31 - 1),
)
def test_paged_decode_fp8(lens, block_size, hkv, group, num_splits, seed):
    gen = torch.Generator().manual_seed(seed)
    d = 32
    cache, table, ks, vs = _paged_fp8(lens, block_size, hkv, d, gen)
    q = torch.randn(len(lens), hkv * group, d, generator=gen).to(DEVICE)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    got, want = torch.empty_like(q), torch.empty_like(q)
    paged_decode_attention(q, cache[0], cache[1], got, seq_lens, table, d**-0.5, num_splits,
                           k_scale=ks, v_scale=vs)
    paged_decode_attention_ref(q, cache[0], cache[1], want, seq_lens, table, d**-0.5, num_splits,
                               k_scale=ks, v_scale=vs)
    torch.testing.assert_close(got, want, **TOL)


@settings(max_examples=5, deadline=None)
@given(
    q_lens=st.lists(st.integers(1, 20), min_size=1, max_size=3),
    ctx=st.integers(0, 40),
    block_size=st.sampled_from([4, 16]),
    group=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**31 - 1),
)
def test_paged_prefill_fp8(q_lens, ctx, block_size, group, seed):
    gen = torch.Generator().manual_seed(seed)
    hkv, d = 2, 16
    lens = [ctx + n for n in q_lens]
    cache, table, ks, vs = _paged_fp8(lens, block_size, hkv, d, gen)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32,
                       device=DEVICE)
    q = torch.randn(sum(q_lens), hkv * group, d, generator=gen).to(DEVICE)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    got, want = torch.empty_like(q), torch.empty_like(q)
    args = (qsl, seq_lens, table, max(q_lens), d**-0.5)
    paged_attention(q, cache[0], cache[1], got, *args, k_scale=ks, v_scale=vs)
    paged_attention_ref(q, cache[0], cache[1], want, *args, k_scale=ks, v_scale=vs)
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_paged_kernels_fp8_with_features(num_splits):
    """A sliding window, sinks and a soft cap over an fp8 cache (the K scale folded into the
    scores before the cap, the V scale after the sink's share of the denominator): decode
    (direct and split) and a mixed prefill step equal their references."""
    gen = torch.Generator().manual_seed(num_splits)
    hkv, group, d, bs = 2, 2, 16, 4
    lens = [3, 29, 45]
    cache, table, ks, vs = _paged_fp8(lens, bs, hkv, d, gen)
    features = dict(sliding_window=11, sinks=torch.linspace(-1.0, 2.0, hkv * group, device=DEVICE),
                    softcap=4.0)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    q = torch.randn(len(lens), hkv * group, d, generator=gen).to(DEVICE)
    got, want = torch.empty_like(q), torch.empty_like(q)
    paged_decode_attention(q, cache[0], cache[1], got, seq_lens, table, d**-0.5, num_splits,
                           k_scale=ks, v_scale=vs, **features)
    paged_decode_attention_ref(q, cache[0], cache[1], want, seq_lens, table, d**-0.5,
                               num_splits, k_scale=ks, v_scale=vs, **features)
    torch.testing.assert_close(got, want, **TOL)
    q_lens = [3, 1, 20]
    qsl = torch.tensor([0, 3, 4, 24], dtype=torch.int32, device=DEVICE)
    q = torch.randn(sum(q_lens), hkv * group, d, generator=gen).to(DEVICE)
    got, want = torch.empty_like(q), torch.empty_like(q)
    args = (qsl, seq_lens, table, max(q_lens), d**-0.5)
    paged_attention(q, cache[0], cache[1], got, *args, k_scale=ks, v_scale=vs, tile_n=16,
                    **features)
    paged_attention_ref(q, cache[0], cache[1], want, *args, k_scale=ks, v_scale=vs, **features)
    torch.testing.assert_close(got, want, **TOL)


@settings(max_examples=4, deadline=None)
@given(
    lens=st.lists(st.integers(1, 50), min_size=1, max_size=3),
    num_heads=st.sampled_from([2, 5]),
    num_splits=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**31 - 1),
)
def test_mla_decode_fp8(lens, num_heads, num_splits, seed):
    gen = torch.Generator().manual_seed(seed)
    lora, rope, block_size = 24, 8, 8
    nblk = [-(-n // block_size) for n in lens]
    num_blocks = 2 + sum(nblk)
    phys = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    table = torch.zeros(len(lens), max(nblk), dtype=torch.int32)
    cache = torch.zeros(num_blocks, block_size, lora + rope).to(FP8_KV_DTYPE)
    cs, ps = torch.tensor([2.0**-6]), torch.tensor([2.0**-3])
    for b, (n, m) in enumerate(zip(lens, nblk)):
        table[b] = torch.tensor(phys[:m] + [0] * (table.shape[1] - m), dtype=torch.int32)
        phys = phys[m:]
        pos = torch.arange(n)
        slots = table[b, pos // block_size].long() * block_size + pos % block_size
        write_latent_cache_ref(cache, torch.randn(n, lora, generator=gen),
                               torch.randn(n, rope, generator=gen) * 20, slots, cs, ps)
    cache, table, cs, ps = cache.to(DEVICE), table.to(DEVICE), cs.to(DEVICE), ps.to(DEVICE)
    q_nope = torch.randn(len(lens), num_heads, lora, generator=gen).to(DEVICE)
    q_pe = torch.randn(len(lens), num_heads, rope, generator=gen).to(DEVICE)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    got = torch.empty_like(q_nope)
    mla_decode_attention(q_nope, q_pe, cache, got, seq_lens, table, 0.1, num_splits,
                         c_scale=cs, pe_scale=ps)
    want = mla_decode_attention_ref(q_nope, q_pe, cache, seq_lens, table, 0.1, cs, ps)
    torch.testing.assert_close(got, want, **TOL)


def test_fp8_decode_close_to_full_precision():
    """Same keys/values in an fp32 cache and an fp8 one (calibrated scales): the fp8 kernel's
    output stays within the e4m3 rounding error of the fp32 reference."""
    gen = torch.Generator().manual_seed(1)
    b, hkv, group, d, n, bs = 2, 2, 2, 32, 40, 8
    k = torch.randn(b * n, hkv, d, generator=gen)
    v = torch.randn(b * n, hkv, d, generator=gen)
    table = torch.arange(1, 1 + b * n // bs, dtype=torch.int32).view(b, -1)
    slots = torch.arange(bs, bs + b * n)
    full = torch.zeros(2, 1 + b * n // bs, bs, hkv, d)
    fp8 = full.to(FP8_KV_DTYPE)
    ks, vs = calibrate_kv_scale(k), calibrate_kv_scale(v)
    write_kv_cache_ref(k, v, full[0], full[1], slots)
    write_kv_cache_ref(k, v, fp8[0], fp8[1], slots, ks, vs)
    q = torch.randn(b, hkv * group, d, generator=gen)
    seq_lens = torch.full((b,), n, dtype=torch.int32)
    want, got = torch.empty_like(q), torch.empty_like(q, device=DEVICE)
    paged_decode_attention_ref(q, full[0], full[1], want, seq_lens, table, d**-0.5, 1)
    paged_decode_attention(q.to(DEVICE), fp8[0].to(DEVICE), fp8[1].to(DEVICE), got,
                           seq_lens.to(DEVICE), table.to(DEVICE), d**-0.5, 1,
                           k_scale=ks.to(DEVICE), v_scale=vs.to(DEVICE))
    err = (got.cpu() - want).abs().max().item()
    print(f"fp8 vs fp32 KV decode: max abs err {err:.4f}")
    assert err < 0.06


_COMPILE_SCRIPT = """
    from lab.kernels import kv_cache_write as kw, mla_cache_write as mw, mla_decode as md
    from lab.kernels import paged_decode as pd, paged_prefill as pp

    def build_fp8(fn, types, consts, **opts):  # pointer arguments 16-byte aligned
        return build(fn, types, consts, {n for n in fn.arg_names if n.endswith("_ptr")}, **opts)

    f32 = dict(qk_scale="fp32", softcap="fp32", sinks_ptr="*fp32")
    off = dict(SLIDING=False, SINKS=False, SOFTCAP=False)  # the layer's features (not fp8's)
    sc = {n: "*fp32" for n in ("k_scale_ptr", "v_scale_ptr", "c_scale_ptr", "pe_scale_ptr")}
    k = build_fp8(pd._decode_split_kernel,
              dict(q_ptr="*bf16", k_ptr="*fp8e4nv", v_ptr="*fp8e4nv", o_ptr="*bf16",
                   seq_lens_ptr="*i32", bt_ptr="*i32", lse_ptr="*fp32", **sc, **f32),
              dict(NUM_SPLITS=1, BLOCK_SIZE=16, TILE_N=64, BLOCK_G=16, HEAD_DIM=128, BLOCK_D=128,
                   STORE_LSE=False, DOT_PRECISION="tf32", KV_FP8=True, **off), num_warps=4,
              num_stages=2)
    assert "mma.sync" in k.asm["ptx"]
    build_fp8(pp._paged_prefill_kernel,
          dict(q_ptr="*bf16", k_cache_ptr="*fp8e4nv", v_cache_ptr="*fp8e4nv", out_ptr="*bf16",
               qsl_ptr="*i32", seq_lens_ptr="*i32", bt_ptr="*i32", **sc, **f32),
          dict(G=4, BLOCK_Q=16, BLOCK_M=64, TILE_N=64, HEAD_DIM=128, BLOCK_SIZE=16,
               DOT_PRECISION="tf32", KV_FP8=True, **off), num_warps=4, num_stages=3)
    build_fp8(md._mla_split_kernel,
          dict(qn_ptr="*bf16", qp_ptr="*bf16", kv_ptr="*fp8e4nv", o_ptr="*bf16",
               seq_lens_ptr="*i32", bt_ptr="*i32", lse_ptr="*fp32", **sc, **f32),
          dict(NUM_SPLITS=1, BLOCK_SIZE=64, TILE_N=32, BLOCK_H=16, LORA=512, BLOCK_L=512,
               ROPE=64, BLOCK_R=64, STORE_LSE=False, DOT_PRECISION="tf32", KV_FP8=True),
          num_warps=8, num_stages=3)
    build_fp8(kw._kv_cache_write_kernel,
          dict(k_ptr="*bf16", v_ptr="*bf16", k_cache_ptr="*fp8e4nv", v_cache_ptr="*fp8e4nv",
               slot_ptr="*i64", **sc),
          dict(BLOCK_SIZE=16, HEAD_DIM=128, BLOCK_H=8, BLOCK_T=2, FP8=True), num_warps=4)
    build_fp8(mw._latent_write_kernel,
          dict(c_ptr="*bf16", pe_ptr="*bf16", cache_ptr="*fp8e4nv", slot_ptr="*i64", **sc),
          dict(BLOCK_SIZE=64, BLOCK_T=4, BLOCK_W=1024, FP8=True), num_warps=4)
    print("ok")
"""


def test_fp8_kernels_compile_for_hopper():
    """AOT-compile every fp8-cache kernel variant for sm_90 with bf16 activations (no GPU
    needed): the fp8 loads, upcasts, scale folds and quantizing stores lower to PTX."""
    compile_for_sm90(_COMPILE_SCRIPT)
