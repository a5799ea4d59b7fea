"""`fp8_gemm` is GPU-only (Triton's interpreter has no fp8 dot): on the CPU the reference's math
(quantize -> GEMM approximates the float GEMM; scale layouts) and the refusal are checked; on
CUDA the kernel is compared with `fp8_gemm_ref` and `torch._scaled_mm`. The sm_90 compile of the
shared scaled-GEMM kernel with fp8 operands is in test_kernel_int8_gemm.py."""

from __future__ import annotations

import pytest
import torch

import lab.kernels  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before kernel modules load)
from lab.kernels.fp8_gemm import FP8_DTYPE, fp8_gemm, fp8_gemm_ref
from lab.kernels.quantize import (
    quantize_fp8_per_tensor,
    quantize_fp8_per_tensor_ref,
    quantize_fp8_per_token_ref,
)


def make(m, n, k, seed, device="cpu", dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(device, dtype)
    w = (torch.randn(n, k, generator=gen) * k**-0.5).to(device, dtype)
    bias = torch.randn(n, generator=gen).to(device, dtype)
    return x, w, bias


def quant_weight_per_channel(w):
    s = w.float().abs().amax(-1).clamp_min(1e-10) / 448
    return (w.float() / s[:, None]).to(FP8_DTYPE), s


@pytest.mark.parametrize("per_token", [True, False])
@pytest.mark.parametrize("m,n,k", [(1, 40, 48), (7, 72, 200)])
def test_reference_approximates_float_gemm(per_token, m, n, k):
    """e4m3 keeps 3 mantissa bits: each operand is within 2**-4 relative, so the dequantized
    GEMM is within a few % of x @ w^T (+ bias)."""
    x, w, bias = make(m, n, k, seed=m)
    xq, sx = (quantize_fp8_per_token_ref if per_token else quantize_fp8_per_tensor_ref)(x)
    wq, sw = quant_weight_per_channel(w)
    out = fp8_gemm_ref(xq, sx, wq, sw, bias, torch.float32)
    exact = x @ w.T + bias
    assert out.shape == (m, n) and out.dtype == torch.float32
    err = (out - exact).abs().max() / (x.abs() @ w.abs().T).max()
    assert err < 2 * 2**-4


def test_reference_is_the_definition():
    x, w, bias = make(3, 8, 16, seed=0)
    xq, sx = quantize_fp8_per_token_ref(x)
    wq, sw = quant_weight_per_channel(w)
    ref = torch.zeros(3, 8)
    for i in range(3):
        for j in range(8):
            ref[i, j] = (xq[i].float() * wq[j].float()).sum() * sx[i, 0] * sw[j] + bias[j]
    torch.testing.assert_close(fp8_gemm_ref(xq, sx, wq, sw, bias, torch.float32), ref)
    scalar = fp8_gemm_ref(xq, sx[:1, 0], wq, sw[:1], None, torch.float16)  # [1] scales
    assert scalar.dtype == torch.float16 and scalar.shape == (3, 8)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only behaviour")
def test_refuses_on_cpu_with_reason():
    x, w, _ = make(2, 16, 32, seed=0)
    xq, sx = quantize_fp8_per_tensor(x)
    wq, sw = quant_weight_per_channel(w)
    with pytest.raises(ValueError, match="interpreter has no fp8"):
        fp8_gemm(xq, sx, wq, sw, None, torch.float32)


@pytest.mark.gpu
def test_bad_inputs_cuda():
    x, w, bias = make(4, 32, 64, seed=0, device="cuda")
    xq, sx = quantize_fp8_per_token_ref(x)
    wq, sw = quant_weight_per_channel(w)
    base = dict(a_q=xq, a_scale=sx, w_q=wq, w_scale=sw, bias=bias, out_dtype=torch.float32)
    for change, msg in [(dict(a_q=xq.view(torch.int8)), "a_q must be torch.float8_e4m3fn"),
                        (dict(w_q=wq[:, :32]), "w_q must be"), (dict(a_scale=sx[:2]), "a_scale"),
                        (dict(w_scale=sw.half()), "w_scale"), (dict(bias=bias[:3]), "bias")]:
        with pytest.raises(ValueError, match=msg):
            fp8_gemm(**{**base, **change})


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1, 4096, 4096), (16, 14336, 4096), (200, 1000, 2000),
                                   (4096, 4096, 4096)])
@pytest.mark.parametrize("per_token", [True, False])
def test_fp8_gemm_cuda(m, n, k, per_token):
    x, w, bias = make(m, n, k, seed=0, device="cuda", dtype=torch.bfloat16)
    xq, sx = (quantize_fp8_per_token_ref if per_token else quantize_fp8_per_tensor_ref)(x)
    wq, sw = quant_weight_per_channel(w)
    out = fp8_gemm(xq, sx, wq, sw, bias, torch.bfloat16)
    ref = fp8_gemm_ref(xq, sx, wq, sw, bias, torch.bfloat16)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
    if hasattr(torch, "_scaled_mm") and m % 16 == 0 and n % 16 == 0:
        sa = sx.float() if per_token else sx.reshape(1, 1).float()
        try:
            mm = torch._scaled_mm(xq, wq.T, scale_a=sa, scale_b=sw.reshape(1, -1),
                                  bias=bias, out_dtype=torch.bfloat16)
        except RuntimeError as e:  # older torch: per-tensor scales only
            pytest.skip(f"torch._scaled_mm rejected these scales: {e}")
        torch.testing.assert_close(out, mm, atol=2e-2, rtol=2e-2)
