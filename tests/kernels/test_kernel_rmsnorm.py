"""RMSNorm kernel (Triton interpreter on CPU) against its PyTorch reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.kernels.rmsnorm import rms_norm, rms_norm_ref
from lab.layers.ops import TorchOps

HIDDEN = [16, 48, 64, 100, 128, 256]
DTYPES = [torch.float32, torch.float16]


def _inputs(rows, n, dtype, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=g).to(device, dtype)
    r = torch.randn(rows, n, generator=g).to(device, dtype)
    w = (torch.rand(n, generator=g) + 0.5).to(device, dtype)
    return x, r, w


def _close(a, b, dtype):
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(a, b, atol=tol, rtol=tol)


@settings(max_examples=15)
@given(rows=st.integers(1, 40), n=st.sampled_from(HIDDEN), dtype=st.sampled_from(DTYPES),
       residual=st.booleans(), seed=st.integers(0, 2**16))
def test_rms_norm_matches_reference(rows, n, dtype, residual, seed):
    x, r, w = _inputs(rows, n, dtype, seed)
    if residual:
        y, h = rms_norm(x, w, 1e-6, r)
        y_ref, h_ref = rms_norm_ref(x, w, 1e-6, r)
        torch.testing.assert_close(h, h_ref, atol=0, rtol=0)  # the add rounds exactly like torch
        _close(y, y_ref, dtype)
    else:
        _close(rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6), dtype)


def test_rms_norm_strided_head_view():
    """Per-head q-norm on a [T, H, D] slice of a fused qkv output: no copy needed, same result."""
    qkv = torch.randn(5, (4 + 2 * 2) * 32)
    q = qkv[:, : 4 * 32].reshape(5, 4, 32)
    w = torch.rand(32) + 0.5
    y = rms_norm(q, w, 1e-6)
    assert y.shape == q.shape and y.is_contiguous()
    _close(y, rms_norm_ref(q, w, 1e-6), torch.float32)


def test_reference_is_the_torch_ops_math():
    x, r, w = _inputs(6, 48, torch.float16, 0)
    torch.testing.assert_close(rms_norm_ref(x, w, 1e-5), TorchOps().rms_norm(x, w, 1e-5), atol=0, rtol=0)
    for a, b in zip(rms_norm_ref(x, w, 1e-5, r), TorchOps().rms_norm(x, w, 1e-5, r)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_rms_norm_rejects_bad_shapes():
    x, r, w = _inputs(3, 16, torch.float32, 0)
    with pytest.raises(ValueError, match="hidden size"):
        rms_norm(x, w[:8], 1e-6)
    with pytest.raises(ValueError, match="residual"):
        rms_norm(x, w, 1e-6, r[:2])


@pytest.mark.gpu
@pytest.mark.parametrize("n", [100, 4096])
def test_rms_norm_bf16_gpu(n):
    x, r, w = _inputs(300, n, torch.bfloat16, 0, device="cuda")
    y, h = rms_norm(x, w, 1e-6, r)
    y_ref, h_ref = rms_norm_ref(x, w, 1e-6, r)
    torch.testing.assert_close(h, h_ref, atol=0, rtol=0)
    torch.testing.assert_close(y, y_ref, atol=2e-2, rtol=2e-2)
