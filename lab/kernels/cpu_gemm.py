"""bf16 GEMM for decode-sized batches on the CPU's AMX tiles (`cpu_gemm.cpp`), beside its
reference.

    y = gemm(x, packed, weight, bias)      x [M, K] bf16, weight [N, K] bf16, bias [N] or None
    packed = pack(weight)                  once, after loading (N % 16 == 0, K % 32 == 0)

What it is for: `kernels=cpu`'s bf16 slot (`AMXGemm`, lab/conf/kernels/cpu.yaml): after
loading, every bf16 CPU weight with a compatible shape is packed for it where the CPU has
AMX-BF16 and the OS grants the tiles, and the linear's forward then runs this kernel, eager or
compiled: `torch.ops.lab_cpu.gemm_bf16` is a dispatcher op with a C++ kernel (no Python between
a compiled graph and it) and a fake implementation registered at setup, so torch.compile keeps
it opaque. At most 64 rows run on the tiles; more rows (prefill) go to oneDNN's matmul on the
dense weight inside the same op. Why a kernel of lab's own and the layout: the .cpp's header;
the speeds: `python -m lab.bench.cpu_gemm` and experiments/results/.

Build: `lab.kernels.cpu_ext`, at the option's setup (before the engine is ready). On a CPU
without AMX-BF16 nothing is built and the slot does not run (the next slot, oneDNN, takes the
weights).

`gemm_ref` is the contract in PyTorch: F.linear in fp32, rounded once to bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lab.kernels.cpu_ext import (
    CPUExtension,
    PackedGemm,
    cpu_flags,
    packed_gemm,
)

EXTENSION = CPUExtension("cpu_gemm")


def applies() -> bool:
    """Whether the CPU has AMX-BF16 (else nothing is built)."""
    return {"amx_bf16", "amx_tile", "avx512_bf16"} <= set(cpu_flags().split())


def supports(weight: torch.Tensor) -> bool:
    """Whether `weight` [N, K] can be packed: bf16 on the CPU, N % 16 == 0, K % 32 == 0."""
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and weight.dim() == 2
            and weight.shape[0] % 16 == 0 and weight.shape[1] % 32 == 0)


class AMXGemm(PackedGemm):
    """kernels=cpu's bf16 GEMM on AMX tiles (module docstring)."""

    extension = EXTENSION
    op = "gemm_bf16"
    dtypes = (torch.bfloat16,)

    def applies(self) -> bool:
        return applies()

    def usable(self, module) -> bool:
        return bool(module.amx_ready())  # the OS may refuse this process the tiles

    def supports(self, weight: torch.Tensor) -> bool:
        return supports(weight)

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        return pack(weight)


available = AMXGemm.available  # whether the op runs here (builds it now)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] bf16 -> the AMX layout (flat [N * K]; cpu_gemm.cpp); the extension must be
    loaded (`available()` or the option's setup)."""
    return EXTENSION.loaded().pack(weight.detach())


def gemm(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor,
         bias: torch.Tensor | None = None) -> torch.Tensor:
    """y [..., N] = x [..., K] W^T (+ bias) through `packed` (= pack(weight)), bf16."""
    return packed_gemm(AMXGemm.op, x, packed, weight, bias)


def gemm_ref(x: torch.Tensor, weight: torch.Tensor,
             bias: torch.Tensor | None = None) -> torch.Tensor:
    """The contract: fp32 products and sums, (+ bias), rounded once to x's dtype."""
    return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)
