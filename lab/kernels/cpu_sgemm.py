"""fp32 GEMM for decode-sized batches on a weight packed once (`cpu_sgemm.cpp`), beside its
reference.

    y = gemm(x, packed, weight, bias)      x [M, K] fp32, weight [N, K] fp32, bias [N] or None
    packed = pack(weight)                  once, after loading
    describe(packed)                       what it runs: "mkl" or "ordered: <layout>"

Two kernels behind the op, the packed weight saying which: lab's own AVX-512 kernel summing
over k in MKL's order ("ordered": pack() keeps it only where its output equals F.linear's bit
for bit on this weight at this thread count, so lab's fp32 linears then give transformers'
bits), else MKL's packed sgemm. `pack_layout` forces a layout and `emulate_ref` is that layout's
order in PyTorch (float64 products, one float32 rounding per FMA), for the tests.

What it is for: `UnquantizedLinearMethod` (lab/layers/linear.py) packs every fp32 CPU weight
of at least _MIN_PACK_ELEMENTS for it where torch has MKL (`available()`), and its forward then
runs this op, eager or compiled: `torch.ops.lab_cpu.gemm_fp32` is a dispatcher op with a C++
kernel and a fake implementation registered here, so torch.compile keeps it opaque (inductor's
freezing would otherwise pack the weight for oneDNN, slower at decode sizes). Below 128 rows it
runs the packed kernel; from 128 rows (prefill) at::linear on the dense weight. Why and the
speeds: the .cpp's header and `python -m lab.bench.cpu_gemm --dtype float32`.

Build: `lab.kernels.cpu_ext` (torch's cpp_extension at first use, cached). Where torch has no
MKL or it cannot be built, `available()` is False and the linears keep their oneDNN path.

`gemm_ref` is the contract in PyTorch: F.linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lab.kernels.cpu_ext import CPUExtension, PackedGemm

# no -ffast-math: it would let the compiler reassociate the ordered kernel's adds
EXTENSION = CPUExtension("cpu_sgemm", extra_cflags=("-fno-fast-math",))


def supports(weight: torch.Tensor) -> bool:
    """Whether `weight` [N, K] can be packed: a contiguous 2-D fp32 CPU tensor."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2
            and weight.is_contiguous())


def _ready() -> bool:
    """torch has MKL and the op is built here."""
    return torch.backends.mkl.is_available() and EXTENSION.available()


OP = PackedGemm(EXTENSION, "gemm_fp32", supports, _ready)
available = OP.available  # () -> whether the op runs here
try_pack = OP.try_pack  # weight -> the packed weight where the op takes it, else None
pack = OP.pack  # weight [N, K] fp32 -> the packed weight (fp32 words; cpu_sgemm.cpp)
gemm = OP.gemm  # (x [..., K], packed, weight, bias=None) -> y [..., N] fp32


def gemm_ref(x: torch.Tensor, weight: torch.Tensor,
             bias: torch.Tensor | None = None) -> torch.Tensor:
    """The contract: F.linear."""
    return F.linear(x, weight, bias)


def has_ordered() -> bool:
    """Whether the ordered kernel runs here (the op is built, with AVX-512)."""
    return available() and EXTENSION.load().has_ordered()


def candidate_layouts(k: int) -> list[tuple[int, int, bool]]:
    """The (parts, kc, balanced) layouts pack() tries for a K, in the order it tries them."""
    return EXTENSION.load().candidate_layouts(k)


def describe(packed: torch.Tensor) -> str:
    """What `packed` runs: "mkl", or "ordered: <parts> parts x blocks of <kc>"."""
    return EXTENSION.load().describe(packed)


def pack_mkl(weight: torch.Tensor) -> torch.Tensor:
    """`weight` packed for MKL's packed sgemm, whatever pack() would choose (A/B, tests)."""
    return EXTENSION.load().pack_mkl(weight)


def pack_layout(weight: torch.Tensor, parts: int, kc: int, balanced: bool = False) -> torch.Tensor:
    """`weight` packed for the ordered kernel in a given summation layout (AVX-512 builds)."""
    return EXTENSION.load().pack_layout(weight, parts, kc, balanced)


def emulate_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, parts: int,
                kc: int, balanced: bool = False) -> torch.Tensor:
    """The ordered kernel's result, bit for bit, in PyTorch: per part, blocks of FMA chains from
    zero (the product exact in float64, one rounding to float32 per step, as an FMA does),
    chained; part 0 starts at the bias; the parts added in order. Slow (a Python loop over k):
    for tests' small shapes."""
    f32, f64 = torch.float32, torch.float64
    xd, wd = x.to(f64), weight.to(f64)
    total = None
    for bounds in EXTENSION.load().layout_blocks(weight.shape[1], parts, kc, balanced):
        chain = None if total is not None or bias is None else bias.to(f32).expand(
            x.shape[0], -1)
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            acc = torch.zeros(x.shape[0], weight.shape[0], dtype=f32)
            for k in range(lo, hi):
                acc = (torch.outer(xd[:, k], wd[:, k]) + acc.to(f64)).to(f32)
            chain = acc if chain is None else (chain.to(f64) + acc).to(f32)
        total = chain if total is None else (total.to(f64) + chain).to(f32)
    return total
