"""fp32 GEMM for decode-sized batches on a weight packed once (`cpu_sgemm.cpp`), beside its
reference.

    y = gemm(x, packed, weight, bias)      x [M, K] fp32, weight [N, K] fp32, bias [N] or None
    packed = pack_layout(weight, 1, 128)   once, after loading (the default slot, BlockedGemm)
    describe(packed)                       what it runs: "mkl" or "ordered: <layout>"

Two kernels behind the op, the packed weight saying which:

- lab's own AVX-512 kernel ("ordered": it sums over k in a fixed layout, `pack_layout`): K in
  blocks, each block an FMA chain from zero, the blocks chained (parts > 1: K in parts summed
  apart, then added). Its order never depends on the thread count or the row count.
  - `BlockedGemm` (kernels=cpu's default fp32 slot where the CPU has AVX-512): one part, blocks
    of `block` (128). Chosen for speed and accuracy, not to match any library's bits: on the
    bench presets' fp32 weights at 16 rows its sums are closer to float64 than F.linear's
    (MKL's) and it takes 0.8x the time of MKL's packed sgemm (experiments/results/).
  - `OrderedGemm` (opt-in): pack() tries candidate layouts on the weight and keeps one only
    where its output equals F.linear's bit for bit on probe rows at this thread count (then
    lab's fp32 linears give transformers' bits), else packs for MKL, where the slot takes
    BlockedGemm's blocks instead. It imitates MKL's internal order, which depends on MKL's
    version and the thread count: that is why it is not the default.
- MKL's packed sgemm (`pack_mkl`, the slot `MKLGemm`): the next slot, for CPUs without
  AVX-512. Not F.linear's bits either (MKL's packed and unpacked paths sum differently).

`emulate_ref` is a layout's order in PyTorch (float64 products, one float32 rounding per FMA),
for the tests.

What it is for: `kernels=cpu`'s fp32 slots `fp32` and `mkl` (lab/conf/kernels/cpu.yaml): after
loading, every fp32 CPU weight of at least a slot's `min_elements` is packed for the first that
runs here,
and the linear's forward then runs this op, eager or compiled: `torch.ops.lab_cpu.gemm_fp32`
is a dispatcher op with a C++ kernel and a fake implementation registered at setup, so
torch.compile keeps it opaque (inductor's freezing would otherwise pack the weight for oneDNN).
Below 128 rows it runs the packed kernel; from 128 rows (prefill) at::linear on the dense
weight. Why: the .cpp's header; the speeds: `python -m lab.bench.cpu_gemm --dtype float32`.

Build: `lab.kernels.cpu_ext`, at the option's setup (before the engine is ready). Where torch
has no MKL nothing is built and neither slot runs (the next slot, oneDNN, takes the weights).

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


class FP32Gemm(PackedGemm):
    """What kernels=cpu's fp32 slots share: this extension's op on fp32 weights, built where
    torch has MKL (the op links MKL's packed sgemm); a slot says how it packs a weight."""

    extension = EXTENSION
    op = "gemm_fp32"
    dtypes = (torch.float32,)

    def applies(self) -> bool:
        return applies()

    def supports(self, weight: torch.Tensor) -> bool:
        return supports(weight)


class MKLGemm(FP32Gemm):
    """MKL's packed sgemm behind lab's op: kernels=cpu's fp32 slot after BlockedGemm, for CPUs
    without AVX-512 (module docstring)."""

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        return pack_mkl(weight)


class BlockedGemm(FP32Gemm):
    """kernels=cpu's fp32 GEMM on AVX-512 CPUs: lab's kernel summing each output over K in
    blocks of `block` (module docstring); where the build has no AVX-512 the slot does not run
    and the next one (MKL's packed sgemm) takes the weights."""

    def __init__(self, min_elements: int = 0, block: int = 128) -> None:
        super().__init__(min_elements)
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"block={block!r} is invalid: use an int >= 1 (the k's each FMA "
                             "chain sums before it is added to the output)")
        self.block = block

    def usable(self, module) -> bool:
        return bool(module.has_ordered())

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        return pack_layout(weight, 1, self.block)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(min_elements={self.min_elements}, block={self.block})"


class OrderedGemm(BlockedGemm):
    """The opt-in fp32 GEMM: the ordered kernel where pack() finds a layout giving F.linear's
    bits on the weight at this thread count, else BlockedGemm's blocks (module docstring)."""

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        packed = pack(weight)
        return super().pack(weight) if describe(packed) == "mkl" else packed


available = FP32Gemm.available  # whether the op runs here (builds it now)


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
    return packed_gemm(FP32Gemm.op, x, packed, weight, bias)


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
    return EXTENSION.loaded().pack_layout(weight.detach(), parts, kc, balanced)


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
