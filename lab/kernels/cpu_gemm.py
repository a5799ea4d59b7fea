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

import functools

import torch
import torch.nn.functional as F

from lab.kernels.cpu_ext import CPUExtension, cpu_flags

EXTENSION = CPUExtension("cpu_gemm")

@functools.cache
def available() -> bool:
    """Whether the kernel is built here with AMX-BF16 and this process may use the tiles (on a
    CPU without AMX-BF16 nothing is built)."""
    if not {"amx_bf16", "amx_tile", "avx512_bf16"} <= set(cpu_flags().split()):
        return False
    if not EXTENSION.available() or not EXTENSION.load().amx_ready():
        return False
    _register_fake()
    return True


def _register_fake() -> None:
    @torch.library.register_fake("lab_cpu::gemm_bf16")
    def _gemm_fake(x, packed, weight, bias):
        return x.new_empty(x.shape[0], weight.shape[0])


def supports(weight: torch.Tensor) -> bool:
    """Whether `weight` [N, K] can be packed: bf16 on the CPU, N % 16 == 0, K % 32 == 0."""
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and weight.dim() == 2
            and weight.shape[0] % 16 == 0 and weight.shape[1] % 32 == 0)


def try_pack(weight: torch.Tensor) -> torch.Tensor | None:
    """The packed weight where the kernel takes it on this machine, else None."""
    if not supports(weight) or not available():
        return None
    return pack(weight)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] bf16 -> the AMX layout (flat [N * K]; cpu_gemm.cpp)."""
    return EXTENSION.load().pack(weight.detach())


def gemm(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor,
         bias: torch.Tensor | None = None) -> torch.Tensor:
    """y [..., N] = x [..., K] W^T (+ bias), bf16, through `packed` (= pack(weight))."""
    y = torch.ops.lab_cpu.gemm_bf16(x.reshape(-1, x.shape[-1]), packed, weight, bias)
    return y.view(*x.shape[:-1], weight.shape[0])


def gemm_ref(x: torch.Tensor, weight: torch.Tensor,
             bias: torch.Tensor | None = None) -> torch.Tensor:
    """The contract: fp32 products and sums, (+ bias), rounded once to x's dtype."""
    return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)
