"""MKL's packed sgemm (lab/kernels/cpu_sgemm.cpp) equals its reference (F.linear) over the row
counts a weight packed once for 16 rows serves (1 to 127) and past them (at::linear), bias,
strided rows; bad input is refused naming it; the linear layers pack fp32 weights for it and it
traces under torch.compile as one opaque op. Skipped where torch has no MKL."""

import pytest
import torch

from lab.kernels import cpu_sgemm
from lab.layers.linear import Linear, UnquantizedLinearMethod

pytestmark = pytest.mark.skipif(not cpu_sgemm.available(),
                                reason="torch has no MKL here (or the op could not be built)")


def _weights(n: int, k: int, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g), (torch.randn(n, generator=g) if bias else None)


@pytest.mark.parametrize("m", [0, 1, 3, 16, 17, 64, 127, 128, 200])
@pytest.mark.parametrize(("n", "k"), [(8, 8), (48, 96), (520, 136)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemm_equals_reference(m, n, k, bias):
    """Rows: fewer than the 16 the weight is packed for, 16, more (17-127: the same packed
    weight), and from 128 on (at::linear on the dense weight)."""
    w, b = _weights(n, k, bias, seed=m + n + k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    b_in = None if b is None else b.clone()
    got = cpu_sgemm.gemm(x, cpu_sgemm.pack(w), w, b)
    assert got.shape == (m, n) and got.dtype == torch.float32
    assert b is None or torch.equal(b, b_in)  # the output starts as a copy, never the bias itself
    torch.testing.assert_close(got, cpu_sgemm.gemm_ref(x, w, b), atol=1e-4, rtol=1e-5)


def test_strided_rows_and_leading_dims():
    w, _ = _weights(64, 64, False)
    x = torch.randn(6, 96)[:, 16:80]  # rows 96 apart
    torch.testing.assert_close(cpu_sgemm.gemm(x, cpu_sgemm.pack(w), w), cpu_sgemm.gemm_ref(x, w),
                               atol=1e-4, rtol=1e-5)
    assert cpu_sgemm.gemm(torch.randn(2, 3, 64), cpu_sgemm.pack(w), w).shape == (2, 3, 64)
    row = torch.randn(1, 64).expand(4, 64)  # one row broadcast: stride 0
    torch.testing.assert_close(cpu_sgemm.gemm(row, cpu_sgemm.pack(w), w),
                               cpu_sgemm.gemm_ref(row, w), atol=1e-4, rtol=1e-5)


def test_bad_input_is_refused_naming_it():
    w, _ = _weights(48, 64, False)
    p = cpu_sgemm.pack(w)
    with pytest.raises(RuntimeError, match="weight must be a contiguous 2-D fp32"):
        cpu_sgemm.pack(w.bfloat16())
    with pytest.raises(RuntimeError, match=r"x must be fp32 \[M, 64\]"):
        cpu_sgemm.gemm(torch.zeros(2, 32), p, w)
    with pytest.raises(RuntimeError, match="packed must be pack"):
        cpu_sgemm.gemm(torch.zeros(2, 64), p[:-1], w)
    with pytest.raises(RuntimeError, match=r"bias must be fp32 \[N\]"):
        cpu_sgemm.gemm(torch.zeros(2, 64), p, w, torch.zeros(47))
    assert not cpu_sgemm.supports(w.t())


def test_linear_layers_pack_fp32_weights_for_it():
    """From 512 x 512 elements (smaller ones stay F.linear), fp32 only; the layer's output is
    F.linear's."""
    method = UnquantizedLinearMethod()
    big, small = Linear(512, 512, bias=True), Linear(64, 64)
    torch.nn.init.normal_(big.bias)
    for layer in (big, small):
        torch.nn.init.normal_(layer.weight)
        method.process_weights_after_loading(layer)
    assert big.kernel is cpu_sgemm.OP and big.packed_weight is None
    assert small.kernel is None
    x = torch.randn(5, 512)
    torch.testing.assert_close(big(x), cpu_sgemm.gemm_ref(x, big.weight, big.bias), atol=1e-4,
                               rtol=1e-5)


def test_it_traces_as_one_opaque_op():
    w, b = _weights(48, 64, True)
    p = cpu_sgemm.pack(w)
    x = torch.randn(5, 64)
    fn = torch.compile(lambda x: torch.relu(cpu_sgemm.gemm(x, p, w, b)), backend="aot_eager",
                       fullgraph=True)
    torch.testing.assert_close(fn(x), torch.relu(cpu_sgemm.gemm_ref(x, w, b)), atol=1e-4,
                               rtol=1e-5)
