"""SwiGLU activation: silu(gate) * up over the fused gate_up output (Triton + PyTorch reference).

    x [T, 2N] = | gate (N) | up (N) |   ->   out [T, N] = silu(gate) * up

fp32 math inside, rounded where PyTorch/HF round (silu's output to the input dtype, then the
product), so low-precision results match the PyTorch path.

Grid (T, cdiv(N, BLOCK)): elementwise, so a row is split into column tiles; a decode step with
a few rows still spreads over many programs. Reads 2N, writes N elements per row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lab.kernels import check_dtype_supported, num_warps_for

_MAX_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, n_cols, stride_x, BLOCK: tl.constexpr):
    """Row program_id(0), columns [program_id(1)*BLOCK, +BLOCK); out is contiguous [T, n_cols]."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    dt = out_ptr.dtype.element_ty
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (act * up).to(dt), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2N] -> new contiguous [..., N] = silu(x[..., :N]) * x[..., N:]."""
    check_dtype_supported(x, "silu_and_mul input")
    if x.shape[-1] % 2:
        raise ValueError(f"last dim must be even (| gate | up |), got {x.shape[-1]}")
    n = x.shape[-1] // 2
    out = torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device)
    x2 = x.reshape(-1, 2 * n)
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    if x2.shape[0] == 0 or n == 0:
        return out
    block = min(triton.next_power_of_2(n), _MAX_BLOCK)
    _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(n, block))](
        x2, out, n, x2.stride(0), BLOCK=block, num_warps=num_warps_for(2 * block)
    )
    return out


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """PyTorch reference: F.silu(gate) * up."""
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
