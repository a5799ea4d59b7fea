"""lab's fp32 GEMM on a packed weight (lab/kernels/cpu_sgemm.cpp) equals its reference (F.linear)
over the row counts a packed weight serves (1 to 127) and past them (at::linear), bias, strided
rows, on MKL's packing and lab's AVX-512 kernel's; bad input is refused naming it; linear layers
pack fp32 weights for their slot and it traces under torch.compile as one opaque op. lab's
kernel sums in its layout's order bit for bit (a PyTorch emulation of that order): the default
slot (BlockedGemm) in blocks of 128 at any thread and row count; pack() (the opt-in
OrderedGemm) keeps the first layout that gives F.linear's bits, else MKL's packed sgemm, where
the slot takes the blocks. Skipped where torch has no MKL."""

import pytest
import torch

from lab.kernels import cpu_sgemm
from lab.layers.cpu_ops import CPUOps
from lab.layers.linear import Linear, UnquantizedLinearMethod

pytestmark = pytest.mark.skipif(not cpu_sgemm.available(),
                                reason="torch has no MKL here (or the op could not be built)")


def _weights(n: int, k: int, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g), (torch.randn(n, generator=g) if bias else None)


@pytest.mark.parametrize("m", [0, 1, 3, 16, 17, 64, 127, 128, 200])
@pytest.mark.parametrize(("n", "k"), [(8, 8), (48, 96), (520, 136)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("kind", ["mkl", "ordered", "blocked"])
def test_gemm_equals_reference(m, n, k, bias, kind):
    """Rows: fewer than the 16 the weight is packed for, 16, more (17-127: the same packed
    weight), and from 128 on (at::linear on the dense weight)."""
    if kind == "blocked" and not cpu_sgemm.has_ordered():
        pytest.skip("lab's fp32 kernel needs AVX-512 (this build has none)")
    pack = {"mkl": cpu_sgemm.pack_mkl, "ordered": cpu_sgemm.pack,
            "blocked": cpu_sgemm.BlockedGemm().pack}[kind]
    w, b = _weights(n, k, bias, seed=m + n + k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    b_in = None if b is None else b.clone()
    got = cpu_sgemm.gemm(x, pack(w), w, b)
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


def test_linear_layers_pack_fp32_weights_for_mkl():
    """From min_elements (smaller ones stay F.linear), fp32 only, MKL's packing by default; the
    layer's output is F.linear's."""
    ops = CPUOps({"fp32": cpu_sgemm.MKLGemm(min_elements=512 * 512)})
    ops.setup(torch.device("cpu"), torch.float32)
    method = UnquantizedLinearMethod(ops)
    big, small = Linear(512, 512, bias=True), Linear(64, 64)
    torch.nn.init.normal_(big.bias)
    for layer in (big, small):
        torch.nn.init.normal_(layer.weight)
        method.process_weights_after_loading(layer)
    assert isinstance(big.kernel, cpu_sgemm.MKLGemm) and cpu_sgemm.describe(
        big.kernel_weight) == "mkl"
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


# ---- the ordered kernel (AVX-512 builds): its sums in a layout's order, and pack()'s choice ----

ordered = pytest.mark.skipif(not cpu_sgemm.has_ordered(),
                             reason="the ordered kernel needs AVX-512 (this build has none)")


@ordered
@pytest.mark.parametrize(("m", "n", "k", "parts", "kc", "balanced"), [
    (1, 17, 64, 1, 64, False),     # one row, one block, a 1-column tail
    (5, 40, 300, 2, 64, False),    # 2 parts of 150: blocks 64, 64, 22
    (8, 48, 96, 4, 16, False),     # 4 parts, one full tile of 3 column blocks
    (9, 100, 200, 2, 48, True),    # balanced: 2 parts of 100 as 64 + 36 -> 2 x 64 (rounded)
    (16, 520, 136, 1, 384, False),  # a decode batch, columns past a tile and a block
    (20, 33, 260, 2, 130, False),  # rows past 2 passes of 8, sub-blocks of 64 inside a block
])
@pytest.mark.parametrize("bias", [False, True])
def test_ordered_kernel_sums_in_its_layouts_order(m, n, k, parts, kc, balanced, bias):
    """Bit for bit the PyTorch emulation of the layout's order (FMA chains from zero per block,
    chained per part from the bias, parts added in order): the kernel's tiles, passes, sub-blocks
    and threads change where it reads, never the order it adds in."""
    w, b = _weights(n, k, bias, seed=m + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k))
    got = cpu_sgemm.gemm(x, cpu_sgemm.pack_layout(w, parts, kc, balanced), w, b)
    assert torch.equal(got, cpu_sgemm.emulate_ref(x, w, b, parts, kc, balanced))
    torch.testing.assert_close(got, cpu_sgemm.gemm_ref(x, w, b), atol=1e-4, rtol=1e-5)


def _gives_linears_bits(packed, w) -> bool:
    g = torch.Generator().manual_seed(3)
    return all(torch.equal(cpu_sgemm.gemm(x, packed, w), cpu_sgemm.gemm_ref(x, w))
               for x in (torch.randn(16, w.shape[1], generator=g),
                         torch.randn(127, w.shape[1], generator=g)))


@ordered
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n", "k"), [(96, 1024), (64, 1408), (80, 136)])
def test_pack_keeps_the_first_layout_giving_linears_bits(threads, n, k):
    """pack() tries the candidate layouts in order on the weight at this thread count and keeps
    the first whose output equals F.linear's bit for bit (on 16 and 127 rows), else MKL's packed
    sgemm; where it keeps one, lab's fp32 linear is F.linear's bits, bias included."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        w, b = _weights(n, k, True, seed=k)
        w = w / k ** 0.5
        want = next((f"ordered: {p} parts x blocks of {kc}" + (" (balanced)" if bal else "")
                     for p, kc, bal in cpu_sgemm.candidate_layouts(k)
                     if _gives_linears_bits(cpu_sgemm.pack_layout(w, p, kc, bal), w)), "mkl")
        packed = cpu_sgemm.pack(w)
        assert cpu_sgemm.describe(packed) == want
        if want != "mkl":
            x = torch.randn(16, k, generator=torch.Generator().manual_seed(4))
            assert torch.equal(cpu_sgemm.gemm(x, packed, w, b), cpu_sgemm.gemm_ref(x, w, b))
    finally:
        torch.set_num_threads(before)


@ordered
@pytest.mark.parametrize("threads", [1, 2])
def test_the_default_slot_sums_in_blocks_whatever_the_threads_and_rows(threads):
    """BlockedGemm (kernels=cpu's fp32 default on AVX-512): K in blocks of `block`, chained from
    the bias: the emulation's bits, the same at any thread count, and each row's outputs the
    same in any batch below 128 rows (a row's sums never depend on the other rows)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        w, b = _weights(100, 300, True, seed=5)
        x = torch.randn(20, 300, generator=torch.Generator().manual_seed(6))
        kernel = cpu_sgemm.BlockedGemm(block=128)
        assert kernel.setup()
        packed = kernel.pack(w)
        assert cpu_sgemm.describe(packed) == "ordered: 1 parts x blocks of 128"
        got = kernel.gemm(x, packed, w, b)
        assert torch.equal(got, cpu_sgemm.emulate_ref(x, w, b, 1, 128))
        assert all(torch.equal(kernel.gemm(x[i:i + 1], packed, w, b), got[i:i + 1])
                   for i in (0, 7, 19))
        wide = torch.cat([x, torch.randn(100, 300, generator=torch.Generator().manual_seed(7))])
        assert torch.equal(kernel.gemm(wide[:127], packed, w, b)[:20], got)
    finally:
        torch.set_num_threads(before)


@ordered
def test_the_ordered_slot_takes_the_blocks_where_no_layout_gives_linears_bits(monkeypatch):
    """Where pack() finds a layout the slot keeps it; where it falls back to MKL (made certain
    here: pack() replaced by MKL's packing), the slot packs BlockedGemm's blocks instead."""
    w, _ = _weights(64, 1024, False, seed=2)
    w = w / 1024 ** 0.5
    slot = cpu_sgemm.OrderedGemm(block=128)
    assert slot.setup()
    found = cpu_sgemm.describe(cpu_sgemm.pack(w))
    assert cpu_sgemm.describe(slot.pack(w)) == (
        found if found != "mkl" else "ordered: 1 parts x blocks of 128")
    monkeypatch.setattr(cpu_sgemm, "pack", cpu_sgemm.pack_mkl)
    assert cpu_sgemm.describe(slot.pack(w)) == "ordered: 1 parts x blocks of 128"


def test_mkl_packing_stays_available_side_by_side():
    w, b = _weights(96, 128, True)
    x = torch.randn(16, 128)
    packed = cpu_sgemm.pack_mkl(w)
    assert cpu_sgemm.describe(packed) == "mkl"
    torch.testing.assert_close(cpu_sgemm.gemm(x, packed, w, b), cpu_sgemm.gemm_ref(x, w, b),
                               atol=1e-4, rtol=1e-5)


@ordered
def test_bad_layouts_are_refused_naming_them():
    w, _ = _weights(48, 64, False)
    with pytest.raises(RuntimeError, match=r"parts must divide K \(64\), got 3"):
        cpu_sgemm.pack_layout(w, 3, 16)
    with pytest.raises(RuntimeError, match="kc must be >= 1, got 0"):
        cpu_sgemm.pack_layout(w, 1, 0)
    with pytest.raises(RuntimeError, match="packed must be pack"):
        cpu_sgemm.describe(torch.zeros(16))
