"""W8A8 fp8 (e4m3fn) GEMM with per-token / per-tensor activation scales and per-channel /
per-tensor weight scales (Triton, GPU only, + PyTorch reference that runs anywhere).

    a_q e4m3 [M, K], a_scale fp32 [M, 1] or [1], w_q e4m3 [N, K], w_scale fp32 [N] or [1],
    bias [N] | None:
    out[m, n] = (sum_k fp32(a_q[m, k]) * fp32(w_q[n, k])) * a_scale[m] * w_scale[n] (+ bias[n]),
    fp32 accumulation and epilogue, one rounding to out_dtype.

The kernel is `int8_gemm._scaled_mm_kernel` with fp8 operands and an fp32 accumulator (wgmma
e4m3 on sm_90 for M > 256, mma for decode tiles; tiles from `int8_gemm.pick_config`). Triton's
interpreter cannot do fp8 dots (they return garbage), so `fp8_gemm` refuses to run there.
"""

from __future__ import annotations

import torch

from lab.kernels import interpreter_active
from lab.kernels.int8_gemm import check_scaled_mm_args, scaled_mm

FP8_DTYPE = torch.float8_e4m3fn


def fp8_gemm(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    config: dict | None = None,
) -> torch.Tensor:
    """fp8 W8A8 GEMM (Triton, CUDA only); contract in the module docstring. `config` overrides
    tile entries as in `int8_gemm`."""
    if interpreter_active() or a_q.device.type != "cuda":
        raise ValueError("fp8_gemm needs a CUDA device: Triton's interpreter has no fp8 "
                         "arithmetic (an fp8 tl.dot returns garbage there); use fp8_gemm_ref "
                         "(kernels=torch) on the CPU")
    check_scaled_mm_args("fp8_gemm", a_q, a_scale, w_q, w_scale, bias, out_dtype, FP8_DTYPE)
    return scaled_mm(a_q, a_scale, w_q, w_scale, bias, out_dtype, config)


def fp8_gemm_ref(a_q, a_scale, w_q, w_scale, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    """PyTorch reference (any device): dequantize to fp32, fp32 matmul, + bias, cast once."""
    a = a_q.float() * a_scale.float().reshape(-1, 1)
    w = w_q.float() * w_scale.float().reshape(-1, 1)
    out = a @ w.T
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)
