"""fp32 GEMM for decode-sized batches through MKL's packed sgemm (`cpu_sgemm.cpp`), beside its
reference.

    y = gemm(x, packed, weight, bias)      x [M, K] fp32, weight [N, K] fp32, bias [N] or None
    packed = pack(weight)                  once, after loading

What it is for: `UnquantizedLinearMethod` (lab/layers/linear.py) packs every fp32 CPU weight
of at least _MIN_PACK_ELEMENTS for it where torch has MKL (`available()`), and its forward then
runs this op, eager or compiled: `torch.ops.lab_cpu.gemm_fp32` is a dispatcher op with a C++
kernel and a fake implementation registered here, so torch.compile keeps it opaque (inductor's
freezing would otherwise pack the weight for oneDNN, slower at decode sizes). Below 128 rows it
runs MKL's packed sgemm; from 128 rows (prefill) at::linear on the dense weight. Why and the
speeds: the .cpp's header and `python -m lab.bench.cpu_gemm --dtype float32`.

Build: `lab.kernels.cpu_ext` (torch's cpp_extension at first use, cached). Where torch has no
MKL or it cannot be built, `available()` is False and the linears keep their oneDNN path.

`gemm_ref` is the contract in PyTorch: F.linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lab.kernels.cpu_ext import CPUExtension, PackedGemm

EXTENSION = CPUExtension("cpu_sgemm")


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
pack = OP.pack  # weight [N, K] fp32 -> MKL's packed weight (fp32 words; cpu_sgemm.cpp)
gemm = OP.gemm  # (x [..., K], packed, weight, bias=None) -> y [..., N] fp32


def gemm_ref(x: torch.Tensor, weight: torch.Tensor,
             bias: torch.Tensor | None = None) -> torch.Tensor:
    """The contract: F.linear."""
    return F.linear(x, weight, bias)
