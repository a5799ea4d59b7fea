"""bf16 GEMM for decode-sized batches on the CPU's AMX tiles (`cpu_gemm.cpp`), beside its
reference.

    y = gemm(x, packed, weight, bias)      x [M, K] bf16, weight [N, K] bf16, bias [N] or None
    packed = pack(weight)                  once, after loading (N % 16 == 0, K % 32 == 0)

What it is for: `UnquantizedLinearMethod` (lab/layers/linear.py) packs every bf16 CPU weight
with a compatible shape when the CPU has AMX-BF16 (`available()`), and its forward then runs
this kernel, eager or compiled: `torch.ops.lab_cpu.gemm_bf16` is a dispatcher op with a C++
kernel (no Python between a compiled graph and it) and a fake implementation registered here,
so torch.compile keeps it opaque. At most 64 rows run on the tiles; more rows (prefill) go to
oneDNN's matmul on the dense weight inside the same op. Why a kernel of lab's own, the layout
and the speeds: the .cpp's header and `python -m lab.bench.cpu_gemm`.

Build: `lab.kernels.cpu_ext` (torch's cpp_extension at first use, cached). Where it cannot be
built, or the CPU or the OS gives no AMX tiles, `available()` is False and the linears keep
their oneDNN path.

`gemm_ref` is the contract in PyTorch: F.linear in fp32, rounded once to bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lab.kernels.cpu_ext import CPUExtension, PackedGemm, cpu_flags

EXTENSION = CPUExtension("cpu_gemm")


def supports(weight: torch.Tensor) -> bool:
    """Whether `weight` [N, K] can be packed: bf16 on the CPU, N % 16 == 0, K % 32 == 0."""
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and weight.dim() == 2
            and weight.shape[0] % 16 == 0 and weight.shape[1] % 32 == 0)


def _ready() -> bool:
    """Built here with AMX-BF16 and this process may use the tiles (on a CPU without AMX-BF16
    nothing is built)."""
    return ({"amx_bf16", "amx_tile", "avx512_bf16"} <= set(cpu_flags().split())
            and EXTENSION.available() and EXTENSION.load().amx_ready())


OP = PackedGemm(EXTENSION, "gemm_bf16", supports, _ready)
available = OP.available  # () -> whether the kernel runs here
try_pack = OP.try_pack  # weight -> the packed weight where the kernel takes it, else None
pack = OP.pack  # weight [N, K] bf16 -> the AMX layout (flat [N * K]; cpu_gemm.cpp)
gemm = OP.gemm  # (x [..., K], packed, weight, bias=None) -> y [..., N] bf16


def gemm_ref(x: torch.Tensor, weight: torch.Tensor,
             bias: torch.Tensor | None = None) -> torch.Tensor:
    """The contract: fp32 products and sums, (+ bias), rounded once to x's dtype."""
    return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)
