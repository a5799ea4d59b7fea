"""RMSNorm with an optional fused residual add (Triton + PyTorch reference).

Numerics follow Hugging Face (and `lab.layers.ops.TorchOps`): the residual add rounds to the
input dtype, the statistics are fp32, the normalised row is cast back to the input dtype and only
then multiplied by the weight:

    h = x + residual                       (input dtype)
    y = weight * (h * rsqrt(mean(h^2) + eps)).to(x.dtype)

Rows are addressed as (group, member) with two strides, so a [T, H, D] view (per-head q/k norm on
a slice of the fused qkv output) is normalised without a copy: row = t * H + h.

Grid cdiv(rows, BLOCK_M): one program normalises BLOCK_M rows of BLOCK_N = next_pow2(N) columns;
narrow rows (head_dim) are packed so a program still moves ~_ROW_TILE elements. One pass over
memory: read x (+ residual, weight), write y (+ h).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lab.kernels import check_dtype_supported, num_warps_for

_ROW_TILE = 2048  # elements per program when rows are narrow


@triton.jit(do_not_specialize=["n_rows"])  # one compile for every batch size
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, y_ptr, h_ptr,
    n_rows, n_cols, group,
    stride_xg, stride_xm, stride_rg, stride_rm,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Normalise rows [pid*BLOCK_M, +BLOCK_M); y and h are contiguous [n_rows, n_cols]."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_ok[None, :]
    g, m = rows // group, rows % group
    x_off = (g * stride_xg + m * stride_xm)[:, None] + cols[None, :]
    out_off = (rows * n_cols)[:, None] + cols[None, :]
    x = tl.load(x_ptr + x_off, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r_off = (g * stride_rg + m * stride_rm)[:, None] + cols[None, :]
        r = tl.load(res_ptr + r_off, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)  # HF adds in dtype
        tl.store(h_ptr + out_off, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=1) / n_cols + eps)
    normed = (xf * rstd[:, None]).to(x_ptr.dtype.element_ty).to(tl.float32)  # cast back first
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + out_off, (normed * w[None, :]).to(y_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t [..., N] as [G, M, N] with a unit last stride (3-D views are kept as they are)."""
    t3 = t if t.dim() == 3 else t.reshape(-1, 1, t.shape[-1])
    return t3 if t3.stride(-1) == 1 else t3.contiguous()


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim of x [..., N]; with `residual` returns (norm(x + r), x + r).

    Outputs are new contiguous tensors of x's shape; y has dtype promote(weight, x), h has x's
    dtype. `residual` must match x's shape and dtype. Inputs may be strided views.
    """
    check_dtype_supported(x, "rms_norm input")
    n = x.shape[-1]
    if weight.shape != (n,):
        raise ValueError(f"weight shape {tuple(weight.shape)} does not match hidden size {n}")
    has_res = residual is not None
    if has_res and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError("residual must have the shape and dtype of x")
    y = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    h = torch.empty(x.shape, dtype=x.dtype, device=x.device) if has_res else y
    x3 = _rows(x)
    r3 = _rows(residual) if has_res else x3
    n_rows = x3.shape[0] * x3.shape[1]
    if n_rows > 0:
        block_n = triton.next_power_of_2(n)
        block_m = max(1, _ROW_TILE // block_n)
        _rms_norm_kernel[(triton.cdiv(n_rows, block_m),)](
            x3, r3, weight.contiguous(), y, h, n_rows, n, x3.shape[1],
            x3.stride(0), x3.stride(1), r3.stride(0), r3.stride(1), eps,
            HAS_RESIDUAL=has_res, BLOCK_M=block_m, BLOCK_N=block_n,
            num_warps=num_warps_for(block_m * block_n),
        )
    return (y, h) if has_res else y


def rms_norm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """PyTorch reference (HF LlamaRMSNorm, plus vLLM's fused-add contract)."""
    if residual is not None:
        h = x + residual
        return rms_norm_ref(h, weight, eps), h
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)
