"""fp32 GEMM for decode-sized batches on a weight packed once (`cpu_sgemm.cpp`), beside its
reference.

    y = gemm(x, packed, weight, bias)      x [M, K] fp32, weight [N, K] fp32, bias [N] or None
    packed = pack_mkl(weight)              once, after loading (or pack(weight): opt-in, below)
    describe(packed)                       what it runs: "mkl" or "ordered: <layout>"

Two kernels behind the op, the packed weight saying which:

- MKL's packed sgemm (`pack_mkl`, the slot `MKLGemm`: kernels=cpu's default for fp32).
- "ordered" (`pack`, the slot `OrderedGemm`, opt-in): lab's own AVX-512 kernel summing over k
  in the order MKL's sgemm sums in at this thread count. pack() tries candidate layouts on the
  weight and keeps one only where its output equals F.linear's bit for bit on probe rows
  (then lab's fp32 linears give transformers' bits), else packs for MKL. What it runs thus
  depends on MKL's internals and the thread count: that is why it is not the default; why one
  may opt in (it is faster at decode sizes): README's "CPU kernels" and experiments/results/.
  `pack_layout` forces a layout and `emulate_ref` is that layout's order in PyTorch (float64
  products, one float32 rounding per FMA), for the tests.

What it is for: `kernels=cpu`'s fp32 slot (lab/conf/kernels/cpu.yaml): after loading, every
fp32 CPU weight of at least the slot's `min_elements` is packed for it where torch has MKL,
and the linear's forward then runs this op, eager or compiled: `torch.ops.lab_cpu.gemm_fp32`
is a dispatcher op with a C++ kernel and a fake implementation registered at setup, so
torch.compile keeps it opaque (inductor's freezing would otherwise pack the weight for oneDNN).
Below 128 rows it runs the packed kernel; from 128 rows (prefill) at::linear on the dense
weight. Why: the .cpp's header; the speeds: `python -m lab.bench.cpu_gemm --dtype float32`.

Build: `lab.kernels.cpu_ext`, at the option's setup (before the engine is ready). Where torch
has no MKL nothing is built and the slot does not run (the next slot, oneDNN, takes the weights).

`gemm_ref` is the contract in PyTorch: F.linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lab.kernels.cpu_ext import CPUExtension, PackedGemm, packed_gemm

# no -ffast-math: it would let the compiler reassociate the ordered kernel's adds
EXTENSION = CPUExtension("cpu_sgemm", extra_cflags=("-fno-fast-math",))


def applies() -> bool:
    """Whether torch has MKL (the op's MKL kernel links against torch's; else nothing is built)."""
    return torch.backends.mkl.is_available()


def supports(weight: torch.Tensor) -> bool:
    """Whether `weight` [N, K] can be packed: a contiguous 2-D fp32 CPU tensor."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2
            and weight.is_contiguous())


class MKLGemm(PackedGemm):
    """kernels=cpu's fp32 GEMM: MKL's packed sgemm behind lab's op (module docstring)."""

    extension = EXTENSION
    op = "gemm_fp32"
    dtypes = (torch.float32,)

    def applies(self) -> bool:
        return applies()

    def supports(self, weight: torch.Tensor) -> bool:
        return supports(weight)

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        return pack_mkl(weight)


class OrderedGemm(MKLGemm):
    """The opt-in fp32 GEMM: the ordered kernel where pack() finds a layout giving F.linear's
    bits on the weight at this thread count, else MKL's packed sgemm (module docstring)."""

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        return pack(weight)


available = MKLGemm.available  # whether the op runs here (builds it now)


def pack_mkl(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [N, K] fp32 packed for MKL's packed sgemm; the extension must be loaded."""
    return EXTENSION.loaded().pack_mkl(weight.detach())


def pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [N, K] fp32 packed for the ordered kernel in the first candidate layout that
    gives F.linear's bits here, else for MKL (module docstring)."""
    return EXTENSION.loaded().pack(weight.detach())


def gemm(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor,
         bias: torch.Tensor | None = None) -> torch.Tensor:
    """y [..., N] = x [..., K] W^T (+ bias) through `packed` (pack_mkl / pack / pack_layout)."""
    return packed_gemm(MKLGemm.op, x, packed, weight, bias)


def gemm_ref(x: torch.Tensor, weight: torch.Tensor,
             bias: torch.Tensor | None = None) -> torch.Tensor:
    """The contract: F.linear."""
    return F.linear(x, weight, bias)


def has_ordered() -> bool:
    """Whether the ordered kernel runs here (the op is built, with AVX-512)."""
    return available() and EXTENSION.loaded().has_ordered()


def candidate_layouts(k: int) -> list[tuple[int, int, bool]]:
    """The (parts, kc, balanced) layouts pack() tries for a K, in the order it tries them."""
    flat = EXTENSION.loaded().candidate_layouts(k)  # parts, kc, balanced of each, in a row
    return [(flat[i], flat[i + 1], bool(flat[i + 2])) for i in range(0, len(flat), 3)]


def describe(packed: torch.Tensor) -> str:
    """What `packed` runs: "mkl", or "ordered: <parts> parts x blocks of <kc>"."""
    return EXTENSION.loaded().describe(packed)


def pack_layout(weight: torch.Tensor, parts: int, kc: int, balanced: bool = False) -> torch.Tensor:
    """`weight` packed for the ordered kernel in a given summation layout (AVX-512 builds)."""
    return EXTENSION.loaded().pack_layout(weight, parts, kc, balanced)


def emulate_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, parts: int,
                kc: int, balanced: bool = False) -> torch.Tensor:
    """The ordered kernel's result, bit for bit, in PyTorch: per part, blocks of FMA chains from
    zero (the product exact in float64, one rounding to float32 per step, as an FMA does),
    chained; part 0 starts at the bias; the parts added in order. Slow (a Python loop over k):
    for tests' small shapes."""
    f32, f64 = torch.float32, torch.float64
    xd, wd = x.to(f64), weight.to(f64)
    total = None
    for part in range(parts):
        bounds = EXTENSION.loaded().layout_blocks(weight.shape[1], parts, kc, balanced, part)
        chain = None if total is not None or bias is None else bias.to(f32).expand(
            x.shape[0], -1)
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            acc = torch.zeros(x.shape[0], weight.shape[0], dtype=f32)
            for k in range(lo, hi):
                acc = (torch.outer(xd[:, k], wd[:, k]) + acc.to(f64)).to(f32)
            chain = acc if chain is None else (chain.to(f64) + acc).to(f32)
        total = chain if total is None else (total.to(f64) + chain).to(f32)
    return total
