"""SiLU·mul kernel (Triton interpreter on CPU) against its PyTorch reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.kernels.silu_and_mul import silu_and_mul, silu_and_mul_ref
from lab.layers.ops import TorchOps


@settings(max_examples=15)
@given(rows=st.integers(1, 40), n=st.sampled_from([16, 48, 64, 100, 128, 1500]),
       dtype=st.sampled_from([torch.float32, torch.float16]), seed=st.integers(0, 2**16))
def test_silu_and_mul_matches_reference(rows, n, dtype, seed):
    x = (3 * torch.randn(rows, 2 * n, generator=torch.Generator().manual_seed(seed))).to(dtype)
    out = silu_and_mul(x)
    assert out.shape == (rows, n) and out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out, silu_and_mul_ref(x), atol=tol, rtol=tol)


def test_silu_and_mul_leading_dims_and_strided_rows():
    x = torch.randn(3, 4, 40)
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_ref(x), atol=1e-6, rtol=1e-6)
    wide = torch.randn(5, 64)[:, :40]  # row stride 64, a view
    torch.testing.assert_close(silu_and_mul(wide), silu_and_mul_ref(wide), atol=1e-6, rtol=1e-6)


def test_reference_is_the_torch_ops_math():
    x = torch.randn(4, 20, dtype=torch.float16)
    torch.testing.assert_close(silu_and_mul_ref(x), TorchOps().silu_and_mul(x), atol=0, rtol=0)


def test_odd_width_is_rejected():
    with pytest.raises(ValueError, match="even"):
        silu_and_mul(torch.randn(2, 7))


@pytest.mark.gpu
def test_silu_and_mul_bf16_gpu():
    x = torch.randn(300, 2 * 1400, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_ref(x), atol=2e-2, rtol=2e-2)
