"""Row argmax on the CPU in C++ (`cpu_argmax.cpp`), beside its reference.

    argmax_rows(x) -> int64 [R]      x [R, V] fp32 (rows contiguous); the first index of each
                                     row's largest value, a NaN counting as the largest

It is the sampler's greedy pick (and the exponential race's) on the CPU: `row_argmax` in
lab/sampling/sampler.py calls it for an fp32 CPU matrix where it is built, else the reference.
AVX-512 where the CPU has it (16 lanes keep their best value and index), a scalar loop
otherwise; rows split over torch's threads. Build: `lab.kernels.cpu_ext` (at first use, cached);
where it cannot be built, `available()` is False.

`argmax_rows_ref` is the contract in PyTorch: `x.max(dim=-1).indices`.
"""

from __future__ import annotations

import torch

from lab.kernels.cpu_ext import CPUExtension

EXTENSION = CPUExtension("cpu_argmax")


def available() -> bool:
    """Whether the kernel is built here (tried once per process)."""
    return EXTENSION.available()


def supports(x: torch.Tensor) -> bool:
    """Whether the kernel takes `x`: a non-empty 2-D fp32 CPU tensor with contiguous rows."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2
            and x.shape[1] > 0 and x.stride(1) == 1)


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """The kernel (module docstring)."""
    return EXTENSION.load().argmax_rows(x)


def argmax_rows_ref(x: torch.Tensor) -> torch.Tensor:
    """The contract: the first index of the largest value per row, NaN largest."""
    return x.max(dim=-1).indices
