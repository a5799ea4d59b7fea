"""`int8_gemm` (Triton; the interpreter runs int8 dots exactly on CPU) against `int8_gemm_ref`,
the reference against a float matmul of the dequantized operands, quantize -> GEMM end to end,
argument checks, tile choice, and an sm_90 compile (int8 and fp8 wgmma) without a GPU."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lab.kernels  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before kernel modules load)
from lab.kernels.int8_gemm import int8_gemm, int8_gemm_ref, pick_config
from lab.kernels.quantize import quantize_int8_per_token
from tests.kernels.sm90 import compile_for_sm90

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make(m, n, k, seed, device=DEVICE, per_tensor_a=False, per_tensor_w=False):
    """Random int8 operands with realistic scales (outputs O(1..100))."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randint(-127, 128, (m, k), generator=gen, dtype=torch.int8)
    w = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    sa = (torch.rand(1 if per_tensor_a else m, 1, generator=gen) + 0.5) / 127
    sw = (torch.rand(1 if per_tensor_w else n, generator=gen) + 0.5) / 127
    if per_tensor_a:
        sa = sa.reshape(1)
    bias = torch.randn(n, generator=gen)
    return [t.to(device) for t in (a, sa, w, sw, bias)]


@settings(max_examples=15, deadline=None)
@given(m=st.integers(1, 40), n=st.sampled_from([1, 16, 40, 72]), k=st.sampled_from([16, 48, 200]),
       out_dtype=st.sampled_from([torch.float32, torch.float16]), has_bias=st.booleans(),
       per_tensor_a=st.booleans(), per_tensor_w=st.booleans(),
       tiles=st.sampled_from([None, dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32),
                              dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=2)]),
       seed=st.integers(0, 2**16))
def test_int8_gemm_matches_reference(m, n, k, out_dtype, has_bias, per_tensor_a, per_tensor_w,
                                     tiles, seed):
    a, sa, w, sw, bias = make(m, n, k, seed, per_tensor_a=per_tensor_a,
                              per_tensor_w=per_tensor_w)
    bias = bias.to(out_dtype) if has_bias else None
    out = int8_gemm(a, sa, w, sw, bias, out_dtype, config=tiles)
    assert out.shape == (m, n) and out.dtype == out_dtype
    ref = int8_gemm_ref(a, sa, w, sw, bias, out_dtype)
    tol = dict(atol=1e-5, rtol=1e-5) if out_dtype == torch.float32 else dict(atol=1e-2, rtol=1e-3)
    torch.testing.assert_close(out, ref, **tol)


def test_int32_accumulation_is_exact():
    """Saturated operands: |sum| = 127 * 127 * K exceeds fp16 and fp32's exact range is not
    needed; unit scales make the output the raw int32 dot."""
    k = 1024
    a = torch.full((3, k), 127, dtype=torch.int8, device=DEVICE)
    a[1] = -127
    w = torch.full((5, k), -127, dtype=torch.int8, device=DEVICE)
    one_a = torch.ones(3, 1, device=DEVICE)
    one_w = torch.ones(5, device=DEVICE)
    out = int8_gemm(a, one_a, w, one_w, None, torch.float32)
    exact = (a.long() @ w.long().T).float()
    assert torch.equal(out, exact)


def test_reference_matches_dequantized_matmul():
    a, sa, w, sw, bias = make(7, 24, 64, seed=3, device="cpu")
    deq = (a.double() * sa.double()) @ (w.double() * sw.double()[:, None]).T + bias.double()
    torch.testing.assert_close(int8_gemm_ref(a, sa, w, sw, bias, torch.float32), deq.float(),
                               atol=1e-5, rtol=1e-5)


def test_quantized_linear_end_to_end():
    """quantize_int8_per_token(x) and per-channel weights: the GEMM approximates x @ W^T."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(9, 96, generator=gen).to(DEVICE)
    wf = torch.randn(40, 96, generator=gen).to(DEVICE) * 0.1
    sw = wf.abs().amax(-1) / 127
    wq = torch.round(wf / sw[:, None]).to(torch.int8)
    xq, sx = quantize_int8_per_token(x)
    out = int8_gemm(xq, sx, wq, sw, None, torch.float32)
    torch.testing.assert_close(out, x @ wf.T, atol=0.05, rtol=0.05)


def test_empty_and_strided():
    a, sa, w, sw, bias = make(4, 24, 48, seed=1)
    assert int8_gemm(a[:0], sa[:0], w, sw, None, torch.float32).shape == (0, 24)
    wide = torch.zeros(4, 80, dtype=torch.int8, device=DEVICE)
    wide[:, 16:64] = a
    torch.testing.assert_close(int8_gemm(wide[:, 16:64], sa, w, sw, bias, torch.float32),
                               int8_gemm_ref(a, sa, w, sw, bias, torch.float32))


def test_bad_inputs():
    a, sa, w, sw, bias = make(4, 24, 48, seed=0, device="cpu")
    base = dict(a_q=a, a_scale=sa, w_q=w, w_scale=sw, bias=bias, out_dtype=torch.float32)
    cases = [
        (dict(a_q=a[None]), "a_q must be"),
        (dict(w_q=w[:, :40]), "w_q must be"),
        (dict(a_q=a.float()), "a_q must be torch.int8"),
        (dict(w_q=w.to(torch.uint8)), "w_q must be torch.int8"),
        (dict(a_q=a.T.contiguous().T), "a_q must be contiguous"),
        (dict(a_scale=sa[:3]), "a_scale must be"),
        (dict(a_scale=sa.half()), "a_scale must be"),
        (dict(w_scale=sw[:5]), "w_scale must be"),
        (dict(bias=bias[:3]), "bias must be"),
        (dict(out_dtype=torch.int32), "out_dtype"),
        (dict(out_dtype=torch.bfloat16), "bfloat16"),
    ]
    for change, msg in cases:
        with pytest.raises(ValueError, match=msg):
            int8_gemm(**{**base, **change})
    with pytest.raises(ValueError, match="BLOCK_N"):
        int8_gemm(**base, config=dict(BLOCK_N=24))


def test_pick_config_tiles():
    assert pick_config(1, 8192, 4096)["BLOCK_M"] == 16
    assert pick_config(16, 8192, 4096)["BLOCK_M"] == 16
    assert pick_config(64, 8192, 4096)["BLOCK_M"] == 64
    big = pick_config(8192, 8192, 4096)
    assert (big["BLOCK_M"], big["BLOCK_N"], big["GROUP_M"]) == (128, 256, 8)
    assert pick_config(8192, 40, 48)["BLOCK_N"] == 64 and pick_config(4, 40, 48)["BLOCK_K"] == 64


_COMPILE_SCRIPT = """
    from lab.kernels import int8_gemm as ig

    fn = ig._scaled_mm_kernel
    aligned = {n for n in fn.arg_names if n.endswith("_ptr") or n.startswith("stride")} | {"N", "K"}
    for dt, acc_int in (("*i8", True), ("*fp8e4nv", False)):
        types = dict(a_ptr=dt, w_ptr=dt, c_ptr="*bf16", a_scale_ptr="*fp32",
                     w_scale_ptr="*fp32", bias_ptr="*bf16")
        for m, mma, even_k in ((16, "mma.sync", True), (8192, "wgmma", False)):
            cfg = ig.pick_config(m, 8192, 4096)
            consts = dict(A_PER_ROW=True, W_PER_COL=True, HAS_BIAS=True, ACC_INT=acc_int,
                          EVEN_K=even_k, **{k: v for k, v in cfg.items() if k.isupper()})
            k = build(fn, types, consts, aligned, num_warps=cfg["num_warps"],
                      num_stages=cfg["num_stages"])
            assert mma in k.asm["ptx"] and k.metadata.shared <= 232448, (dt, m, cfg)
    print("ok")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the gpu-marked tests run the kernels there")
def test_kernels_compile_for_hopper():
    """AOT-compile the scaled GEMM for sm_90 (int8 and fp8 operands): decode tiles use mma, the
    large tile wgmma, and the pipelined shared memory fits the H100/H200's 227 KiB."""
    compile_for_sm90(_COMPILE_SCRIPT, TRITON_DEFAULT_FP_FUSION="1")


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1, 4096, 4096), (16, 14336, 4096), (200, 1000, 2000),
                                   (4096, 4096, 4096)])
def test_int8_gemm_bf16_cuda(m, n, k):
    a, sa, w, sw, bias = make(m, n, k, seed=0, device="cuda")
    out = int8_gemm(a, sa, w, sw, bias.bfloat16(), torch.bfloat16)
    ref = int8_gemm_ref(a, sa, w, sw, bias.bfloat16(), torch.bfloat16)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=1e-2)
    if hasattr(torch, "_int_mm") and m > 16 and m % 8 == 0:
        mm = torch._int_mm(a, w.T).float() * sa * sw[None] + bias
        torch.testing.assert_close(out.float(), mm, atol=0.5, rtol=1e-2)
