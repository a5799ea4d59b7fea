"""`w4a16_gemm` (Triton, interpreter on CPU) against `w4a16_gemm_ref`, with and without split-K;
pack/unpack round trip; the quantizer's error bounds; argument checks; tile and split-K choice;
an sm_90 compile without a GPU."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lab.kernels  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before kernel modules load)
from lab.kernels.w4a16_gemm import (
    dequantize_w4,
    pack_int4,
    pick_config,
    quantize_w4,
    unpack_int4,
    w4a16_gemm,
    w4a16_gemm_ref,
)
from tests.kernels.sm90 import compile_for_sm90

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=2e-2, rtol=1e-2),
       torch.bfloat16: dict(atol=5e-2, rtol=2e-2)}


def make(m, n, k, g, symmetric, dtype, seed, device=DEVICE, scale_fp32=False):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(device, dtype)
    w = torch.randn(n, k, generator=gen).to(device) * k**-0.5
    packed, s, z = quantize_w4(w, g, symmetric)
    s = s.float() if scale_fp32 else s.to(dtype)
    bias = torch.randn(n, generator=gen).to(device, dtype)
    return x, packed, s, z, bias, w


@settings(max_examples=15, deadline=None)
@given(m=st.integers(1, 24), n=st.sampled_from([1, 16, 40, 72]),
       kg=st.sampled_from([(48, 48), (64, 32), (96, 16), (256, 128)]),
       symmetric=st.booleans(), dtype=st.sampled_from([torch.float32, torch.float16]),
       scale_fp32=st.booleans(), has_bias=st.booleans(),
       tiles=st.sampled_from([None, dict(SPLIT_K=3), dict(BLOCK_N=16, BLOCK_K=16, SPLIT_K=2),
                              dict(BLOCK_M=16, BLOCK_N=32, GROUP_M=2)]),
       seed=st.integers(0, 2**16))
def test_w4a16_matches_reference(m, n, kg, symmetric, dtype, scale_fp32, has_bias, tiles, seed):
    k, g = kg
    if tiles and g % tiles.get("BLOCK_K", 16):
        tiles = {**tiles, "BLOCK_K": 16}
    x, packed, s, z, bias, _ = make(m, n, k, g, symmetric, dtype, seed, scale_fp32=scale_fp32)
    bias = bias if has_bias else None
    out = w4a16_gemm(x, packed, s, z, g, bias, config=tiles)
    assert out.shape == (m, n) and out.dtype == dtype
    torch.testing.assert_close(out, w4a16_gemm_ref(x, packed, s, z, g, bias), **TOL[dtype])


def test_split_k_uneven_and_more_splits_than_blocks():
    """K = 5 blocks split 3 ways (2, 2, 1 blocks) and SPLIT_K above the block count."""
    x, packed, s, z, bias, _ = make(3, 40, 80, 16, False, torch.float32, seed=2)
    ref = w4a16_gemm_ref(x, packed, s, z, 16, bias)
    for split in (1, 2, 3, 5, 9):
        out = w4a16_gemm(x, packed, s, z, 16, bias, config=dict(BLOCK_K=16, SPLIT_K=split))
        torch.testing.assert_close(out, ref, **TOL[torch.float32])


def test_pack_unpack_round_trip_and_layout():
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (5, 12), generator=gen)
    p = pack_int4(q)
    assert p.dtype == torch.uint8 and p.shape == (5, 6)
    assert torch.equal(p[:, 0], (q[:, 0] | (q[:, 1] << 4)).to(torch.uint8))  # low nibble = even k
    assert torch.equal(unpack_int4(p), q.to(torch.uint8))
    assert torch.equal(pack_int4(unpack_int4(p)), p)


@pytest.mark.parametrize("symmetric", [True, False])
def test_quantizer_error_bounds(symmetric):
    """Round to nearest: |w - dequant(w)| <= s / 2 per group; symmetric uses s = amax / 7 with
    zero point 8, asymmetric covers [min, max] (min <= 0 <= max) with an integer zero point."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(8, 256, generator=gen) * torch.tensor([1e-3, 1, 5, 0.1] * 2)[:, None]
    w[3] = w[3].abs()  # all-positive rows: the asymmetric range still includes 0
    w[7, :64] = 0  # an all-zero group
    packed, s, z = quantize_w4(w, 64, symmetric)
    assert packed.shape == (8, 128) and s.shape == (8, 4)
    assert (z is None) == symmetric
    deq = dequantize_w4(packed, s, z, 64)
    err = (w - deq).abs().reshape(8, 4, 64)
    assert (err <= s[..., None] / 2 * (1 + 1e-5) + 1e-12).all()
    assert deq[7, :64].abs().max() == 0
    if symmetric:
        torch.testing.assert_close(s, (w.reshape(8, 4, 64).abs().amax(-1) / 7).clamp_min(1e-10))
    else:
        assert z.dtype == torch.uint8 and int(z.max()) <= 15


def test_end_to_end_approximates_float_linear():
    x, packed, s, z, bias, w = make(5, 64, 256, 128, False, torch.float32, seed=4)
    out = w4a16_gemm(x, packed, s, z, 128, bias)
    torch.testing.assert_close(out, x @ w.T + bias, atol=0.3, rtol=0.1)


def test_empty_and_strided():
    x, packed, s, z, bias, _ = make(4, 24, 64, 32, True, torch.float32, seed=1)
    assert w4a16_gemm(x[:0], packed, s, z, 32, bias).shape == (0, 24)
    wide = torch.zeros(4, 100, device=DEVICE)
    wide[:, 20:84] = x
    torch.testing.assert_close(w4a16_gemm(wide[:, 20:84], packed, s, z, 32, bias),
                               w4a16_gemm_ref(x, packed, s, z, 32, bias), **TOL[torch.float32])


def test_bad_inputs():
    x, packed, s, z, bias, _ = make(4, 24, 64, 32, False, torch.float32, seed=0, device="cpu")
    base = dict(x=x, w_packed=packed, scales=s, zeros=z, group_size=32, bias=bias)
    cases = [
        (dict(x=x[None]), "x must be"),
        (dict(x=x.int()), "x must be fp32"),
        (dict(w_packed=packed[:, :16]), "w_packed must be"),
        (dict(w_packed=packed.to(torch.int8)), "w_packed must be uint8"),
        (dict(group_size=24), "group_size must be a multiple of 16"),
        (dict(group_size=48), "multiple of group_size"),
        (dict(scales=s[:, :1]), "scales must be"),
        (dict(scales=s.half()), "scales must be fp32 or x's dtype"),
        (dict(zeros=z[:, :1]), "zeros must be"),
        (dict(bias=bias[:3]), "bias must be"),
        (dict(x=x.bfloat16(), scales=s.bfloat16()), "bfloat16"),
    ]
    for change, msg in cases:
        with pytest.raises(ValueError, match=msg):
            w4a16_gemm(**{**base, **change})
    with pytest.raises(ValueError, match="BLOCK_K"):
        w4a16_gemm(**base, config=dict(BLOCK_K=64))
    with pytest.raises(ValueError, match="K even"):
        pack_int4(torch.zeros(2, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="0..15"):
        pack_int4(torch.full((2, 4), 16))
    with pytest.raises(ValueError, match="integer"):
        pack_int4(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="multiple of group_size"):
        quantize_w4(torch.randn(4, 96), 64)


def test_pick_config_split_k():
    cfg = pick_config(1, 14336, 4096, 128)
    assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SPLIT_K"]) == (16, 64, 128, 2)
    assert pick_config(16, 4096, 14336, 128)["SPLIT_K"] == 5  # 64 tiles -> ~2 programs per SM
    big = pick_config(512, 14336, 4096, 128)
    assert big["SPLIT_K"] == 1 and big["BLOCK_M"] == 128
    assert pick_config(4, 4096, 4096, 32)["BLOCK_K"] == 32  # BLOCK_K divides the group


_COMPILE_SCRIPT = """
    from lab.kernels import w4a16_gemm as wq

    fn = wq._w4a16_kernel
    aligned = {n for n in fn.arg_names if n.endswith("_ptr") or n.startswith("stride")} | {"N", "K"}
    for m in (1, 512):
        cfg = wq.pick_config(m, 14336, 4096, 128)
        split = cfg.pop("SPLIT_K")
        types = dict(x_ptr="*bf16", w_ptr="*u8", s_ptr="*bf16", z_ptr="*u8", bias_ptr="*bf16",
                     c_ptr="*fp32" if split > 1 else "*bf16")
        consts = dict(GROUP=128, HAS_ZEROS=m > 1, HAS_BIAS=True, SPLIT_K=split,
                      DOT_PRECISION="tf32", **{k: v for k, v in cfg.items() if k.isupper()})
        k = build(fn, types, consts, aligned, num_warps=cfg["num_warps"],
                  num_stages=cfg["num_stages"])
        assert ("wgmma" if m > 64 else "mma") in k.asm["ptx"], (m, cfg)
    build(wq._split_k_reduce_kernel, dict(p_ptr="*fp32", bias_ptr="*bf16", c_ptr="*bf16"),
          dict(SPLIT_K=2, HAS_BIAS=True, BLOCK=1024))
    print("ok")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the gpu-marked tests run the kernels there")
def test_kernels_compile_for_hopper():
    compile_for_sm90(_COMPILE_SCRIPT)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1, 14336, 4096), (16, 4096, 14336), (48, 1000, 2048),
                                   (512, 4096, 4096)])
@pytest.mark.parametrize("symmetric", [True, False])
def test_w4a16_bf16_cuda(m, n, k, symmetric):
    x, packed, s, z, bias, _ = make(m, n, k, 128, symmetric, torch.bfloat16, seed=0, device="cuda")
    out = w4a16_gemm(x, packed, s, z, 128, bias)
    torch.testing.assert_close(out, w4a16_gemm_ref(x, packed, s, z, 128, bias),
                               **TOL[torch.bfloat16])
