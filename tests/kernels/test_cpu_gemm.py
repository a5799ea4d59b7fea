"""The AMX bf16 GEMM (lab/kernels/cpu_gemm.cpp) equals its reference (F.linear in fp32, rounded
once) over decode-sized and prefill-sized row counts, tails of the 64-column groups, bias,
strided rows; bad input is refused naming it; kernels=cpu's linears pack bf16 weights for it and
it traces under torch.compile as one opaque op. Skipped where the CPU has no AMX-BF16."""

import pytest
import torch

from lab.kernels import cpu_gemm
from lab.layers.cpu_ops import CPUOps, OneDNNGemm
from lab.layers.linear import Linear, UnquantizedLinearMethod

pytestmark = pytest.mark.skipif(not cpu_gemm.available(),
                                reason="no AMX-BF16 here (or the kernel could not be built)")


def _weights(n: int, k: int, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g).bfloat16()
    b = torch.randn(n, generator=g).bfloat16() if bias else None
    return w, b


@pytest.mark.parametrize("m", [0, 1, 5, 16, 17, 40, 64, 65, 130])
@pytest.mark.parametrize(("n", "k"), [(16, 32), (48, 96), (64, 64), (80, 32), (272, 160)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemm_equals_reference(m, n, k, bias):
    """Rows: under one tile (1, 5), one tile (16), chunks with a tail (17, 40), the most on the
    tiles (64) and past it (65, 130: oneDNN on the dense weight). Columns: groups of 64 with
    1-4 tiles in the last one."""
    w, b = _weights(n, k, bias, seed=m + n + k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).bfloat16()
    got = cpu_gemm.gemm(x, cpu_gemm.pack(w), w, b)
    want = cpu_gemm.gemm_ref(x, w, b)
    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    # fp32 sums in a different order, then one bf16 rounding: at most a unit or two of bf16
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=1.6e-2)


def test_strided_rows_and_leading_dims():
    w, _ = _weights(64, 64, False)
    base = torch.randn(6, 96).bfloat16()
    x = base[:, 16:80]  # rows 96 apart
    torch.testing.assert_close(cpu_gemm.gemm(x, cpu_gemm.pack(w), w).float(),
                               cpu_gemm.gemm_ref(x, w).float(), atol=2e-2, rtol=1.6e-2)
    x3 = torch.randn(2, 3, 64).bfloat16()
    assert cpu_gemm.gemm(x3, cpu_gemm.pack(w), w).shape == (2, 3, 64)


def test_bad_input_is_refused_naming_it():
    w, _ = _weights(48, 64, False)
    p = cpu_gemm.pack(w)
    with pytest.raises(RuntimeError, match="N % 16 == 0 and K % 32 == 0"):
        cpu_gemm.pack(torch.zeros(40, 64).bfloat16())
    with pytest.raises(RuntimeError, match="weight must be a 2-D bf16"):
        cpu_gemm.pack(w.float())
    with pytest.raises(RuntimeError, match=r"x must be bf16 \[M, 64\]"):
        cpu_gemm.gemm(torch.zeros(2, 32).bfloat16(), p, w)
    with pytest.raises(RuntimeError, match="packed must be pack"):
        cpu_gemm.gemm(torch.zeros(2, 64).bfloat16(), p[:-1], w)
    assert not cpu_gemm.supports(torch.zeros(40, 64).bfloat16())
    assert not cpu_gemm.supports(torch.zeros(48, 64))


def _linear(dtype, n=80, k=96):
    """A linear with kernels=cpu's bf16 slot, then oneDNN for any weight (no size threshold)."""
    ops = CPUOps({"bf16": cpu_gemm.AMXGemm(), "onednn": OneDNNGemm()})
    ops.setup(torch.device("cpu"), dtype)
    layer = Linear(k, n, bias=True, params_dtype=dtype, quant_method=UnquantizedLinearMethod(ops))
    with torch.no_grad():
        layer.weight.normal_()
        layer.bias.normal_()
    layer.quant_method.process_weights_after_loading(layer)
    return layer


def test_linear_packs_bf16_for_amx_and_fp32_for_onednn():
    layer = _linear(torch.bfloat16)
    assert isinstance(layer.kernel, cpu_gemm.AMXGemm)
    x = torch.randn(7, 96).bfloat16()
    torch.testing.assert_close(layer(x).float(),
                               cpu_gemm.gemm_ref(x, layer.weight, layer.bias).float(),
                               atol=2e-2, rtol=1.6e-2)
    assert isinstance(_linear(torch.float32).kernel, OneDNNGemm)
    assert isinstance(_linear(torch.bfloat16, n=40).kernel, OneDNNGemm)  # N % 16 != 0


def test_traces_as_one_opaque_op_with_a_symbolic_row_count():
    layer = _linear(torch.bfloat16)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    f = torch.compile(layer, backend=backend, fullgraph=True, dynamic=True)
    for m in (3, 9):
        x = torch.randn(m, 96).bfloat16()
        torch.testing.assert_close(f(x), layer(x))
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert "lab_cpu.gemm_bf16" in targets


def test_nothing_is_built_on_a_cpu_without_amx(monkeypatch):
    built = []
    monkeypatch.setattr(cpu_gemm, "cpu_flags", lambda: "flags : fpu sse2 avx2 avx512f")
    monkeypatch.setattr(cpu_gemm.EXTENSION, "module", None)
    monkeypatch.setattr(cpu_gemm.EXTENSION, "build", lambda: built.append(1))
    kernel = cpu_gemm.AMXGemm()
    assert not kernel.setup() and not built
    assert not kernel.takes(torch.zeros(64, 64).bfloat16())
