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

import functools

import torch
import torch.nn.functional as F

from lab.kernels.cpu_ext import CPUExtension

EXTENSION = CPUExtension("cpu_sgemm")


@functools.cache
def available() -> bool:
    """Whether torch has MKL and the op is built here (tried once per process)."""
    if not torch.backends.mkl.is_available() or not EXTENSION.available():
        return False
    EXTENSION.load()
    _register_fake()
    return True


def _register_fake() -> None:
    @torch.library.register_fake("lab_cpu::gemm_fp32")
    def _gemm_fake(x, packed, weight, bias):
        return x.new_empty(x.shape[0], weight.shape[0])


def supports(weight: torch.Tensor) -> bool:
    """Whether `weight` [N, K] can be packed: a contiguous 2-D fp32 CPU tensor."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2
            and weight.is_contiguous())


def try_pack(weight: torch.Tensor) -> torch.Tensor | None:
    """The packed weight where the op takes it on this machine, else None."""
    if not supports(weight) or not available():
        return None
    return pack(weight)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] fp32 -> MKL's packed weight (fp32 words; cpu_sgemm.cpp)."""
    return EXTENSION.load().pack(weight.detach())


def gemm(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor,
         bias: torch.Tensor | None = None) -> torch.Tensor:
    """y [..., N] = x [..., K] W^T (+ bias), fp32, through `packed` (= pack(weight))."""
    y = torch.ops.lab_cpu.gemm_fp32(x.reshape(-1, x.shape[-1]), packed, weight, bias)
    return y.view(*x.shape[:-1], weight.shape[0])


def gemm_ref(x: torch.Tensor, weight: torch.Tensor,
             bias: torch.Tensor | None = None) -> torch.Tensor:
    """The contract: F.linear."""
    return F.linear(x, weight, bias)
