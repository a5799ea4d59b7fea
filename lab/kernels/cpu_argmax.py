"""Row argmax on the CPU in C++ (`cpu_argmax.cpp`), beside its reference.

    argmax_rows(x) -> int64 [R]      x [R, V] fp32 (rows contiguous); the first index of each
                                     row's largest value, a NaN counting as the largest

It is the sampler's greedy pick (and the exponential race's) under `kernels=cpu`: the option's
`argmax` slot is a `CPUArgmax`, which runs the kernel for an fp32 CPU matrix and the reference
for anything else (lab/layers/cpu_ops.py; the sampler asks the kernels option, never this
module). AVX-512 where the CPU has it (16 lanes keep their best value and index), a scalar loop
otherwise; rows split over torch's threads. Build: `lab.kernels.cpu_ext`, from the option's
setup (before the engine is ready) or `load()`.

`argmax_rows_ref` is the contract in PyTorch: `x.max(dim=-1).indices` (ATen's max(dim) rather
than argmax, which is slower on the CPU).
"""

from __future__ import annotations

import torch

from lab.kernels.cpu_ext import CPUExtension, CPUKernelUnavailable

EXTENSION = CPUExtension("cpu_argmax")


def applies() -> bool:
    """Whether the kernel can run on this machine at all (any CPU: a scalar loop without AVX-512)."""
    return True


def load():
    """The extension, built or loaded now (CPUKernelUnavailable where it cannot be built)."""
    return EXTENSION.load()


def available() -> bool:
    """Whether the kernel is built here (builds it now if needed: tests, benchmarks)."""
    try:
        load()
        return True
    except CPUKernelUnavailable:
        return False


def supports(x: torch.Tensor) -> bool:
    """Whether the kernel takes `x`: a non-empty 2-D fp32 CPU tensor with contiguous rows."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2
            and x.shape[1] > 0 and x.stride(1) == 1)


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """The kernel (module docstring); the extension must be loaded already (`load()`)."""
    return EXTENSION.loaded().argmax_rows(x)


def argmax_rows_ref(x: torch.Tensor) -> torch.Tensor:
    """The contract: the first index of the largest value per row, NaN largest."""
    return x.max(dim=-1).indices


class CPUArgmax:
    """kernels=cpu's `argmax` slot: the kernel where it takes the matrix, else the reference."""

    def __init__(self) -> None:
        self.ready = False

    def setup(self) -> bool:
        """Build or load the kernel (CPUKernelUnavailable where it cannot be built); whether it
        runs here."""
        load()
        self.ready = True
        return True

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.ready and supports(x):
            return argmax_rows(x)
        return argmax_rows_ref(x)

    def __repr__(self) -> str:
        return "CPUArgmax()"
