"""Dynamic activation quantization (Triton + PyTorch references): symmetric int8 per token, fp8
(e4m3fn) per token and per tensor. Contract (`*_ref` are the definitions):

    int8 per token:  scale[m] = max(amax_m, EPS) / 127,  q[m, k] = clamp(round(x[m, k] / scale[m]),
                     -127, 127), round half to even (torch.round); scale fp32 [M, 1].
    fp8 per token:   scale[m] = max(amax_m, EPS) / 448,  q[m, k] = fp8(clamp(x / scale[m], +-448))
                     (round to nearest even in the fp8 conversion); scale fp32 [M, 1].
    fp8 per tensor:  the same with one amax over the whole tensor; scale fp32 [1].

amax_m = max_k |x[m, k]| in fp32; EPS = 1e-10 keeps the scale positive for an all-zero row (its q
is then 0). x / scale is an IEEE-rounded fp32 division in both paths (`div_rn`, not the GPU's
approximate division), so the Triton path matches the reference bit for bit.

Kernels: one program per row. A row of at most BLOCK elements stays in registers (one read);
longer rows are read twice (amax pass, then quantize pass) in BLOCK chunks. Per tensor runs a
small amax kernel first (row maxima combined with a float atomic_max into a zeroed fp32 scalar,
valid since |x| >= 0), then the quantize kernel reads that scalar: no host sync, graph-safe.
The fp8 conversion works in the interpreter too (it converts through numpy), so all of this runs
on the CPU; bf16 inputs need a GPU (no bf16 in the interpreter).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lab.kernels import check_dtype_supported, num_warps_for

EPS = 1e-10
INT8_MAX = 127.0
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
FP8_DTYPE = torch.float8_e4m3fn
MAX_BLOCK = 4096


@triton.jit
def _round_half_even(v):
    """Round to nearest, ties to even (torch.round), for |v| < 2**22."""
    r = tl.floor(v + 0.5)
    tie = (r - v) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where(tie & odd, r - 1.0, r)


@triton.jit
def _round_to_e4m3(v):
    """Round fp32 v (|v| <= 448) to the nearest e4m3 value, ties to even, in fp32: the spacing is
    2**(e - 3) for exponent e >= -6 and 2**-9 below (subnormals). Done before the conversion
    because the interpreter's fp32 -> fp8 conversion mishandles a carry into the exponent
    (125.6 became 64); on the GPU the conversion then is exact either way. Tiny negatives round
    to -0.0, as torch's conversion does."""
    e = (v.to(tl.int32, bitcast=True) >> 23) & 0xFF
    e = tl.maximum(e, 127 - 6) - 3
    ulp = (e << 23).to(tl.float32, bitcast=True)
    inv_ulp = ((254 - e) << 23).to(tl.float32, bitcast=True)  # exact powers of two
    r = _round_half_even(v * inv_ulp) * ulp
    sign = v.to(tl.int32, bitcast=True) & -0x80000000  # keep the sign of values rounded to 0
    return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _row_absmax_kernel(x_ptr, amax_ptr, K, stride_xm, BLOCK: tl.constexpr):
    """amax_ptr[0] = max(amax_ptr[0], max_k |x[row, k]|) (amax_ptr zeroed by the caller)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = tl.zeros([BLOCK], tl.float32)
    for k0 in range(0, K, BLOCK):
        v = tl.load(x_ptr + row * stride_xm + k0 + offs, mask=k0 + offs < K, other=0.0)
        m = tl.maximum(m, tl.abs(v.to(tl.float32)))
    tl.atomic_max(amax_ptr, tl.max(m, 0))


@triton.jit
def _quantize_kernel(
    x_ptr, q_ptr, scale_ptr, amax_ptr,
    K, stride_xm, stride_qm,
    QMAX: tl.constexpr,
    EPS_: tl.constexpr,
    PER_TOKEN: tl.constexpr,
    IS_INT: tl.constexpr,
    BLOCK: tl.constexpr,
    ONE_PASS: tl.constexpr,
):
    """Quantize row `program_id` of x (see the module docstring). PER_TOKEN: the row's scale is
    computed here and stored at scale_ptr[row]; otherwise amax_ptr[0] holds the tensor amax and
    program 0 stores the scale at scale_ptr[0]."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    x_row = x_ptr + row * stride_xm
    q_row = q_ptr + row * stride_qm
    if ONE_PASS:
        v_first = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
    if PER_TOKEN:
        if ONE_PASS:
            amax = tl.max(tl.abs(v_first), 0)
        else:
            m = tl.zeros([BLOCK], tl.float32)
            for k0 in range(0, K, BLOCK):
                v = tl.load(x_row + k0 + offs, mask=k0 + offs < K, other=0.0)
                m = tl.maximum(m, tl.abs(v.to(tl.float32)))
            amax = tl.max(m, 0)
    else:
        amax = tl.load(amax_ptr)
    scale = tl.math.div_rn(tl.maximum(amax, EPS_), QMAX)
    if PER_TOKEN:
        tl.store(scale_ptr + row, scale)
    else:
        if row == 0:
            tl.store(scale_ptr, scale)
    for k0 in range(0, K, BLOCK):
        if ONE_PASS:
            v = v_first
        else:
            v = tl.load(x_row + k0 + offs, mask=k0 + offs < K, other=0.0).to(tl.float32)
        y = tl.math.div_rn(v, scale)
        if IS_INT:
            y = tl.minimum(tl.maximum(_round_half_even(y), -QMAX), QMAX)
        else:
            y = _round_to_e4m3(tl.minimum(tl.maximum(y, -QMAX), QMAX))
        tl.store(q_row + k0 + offs, y.to(q_ptr.dtype.element_ty), mask=k0 + offs < K)


def _check_x(x: torch.Tensor, what: str) -> torch.Tensor:
    if x.dim() != 2:
        raise ValueError(f"{what}: x must be 2-D [M, K], got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"{what}: x must be fp32, fp16 or bf16, got {x.dtype}")
    check_dtype_supported(x, f"{what} x")
    return x if x.stride(-1) == 1 else x.contiguous()


def _launch(x: torch.Tensor, q_dtype: torch.dtype, qmax: float, per_token: bool, what: str):
    x = _check_x(x, what)
    m, k = x.shape
    q = torch.empty((m, k), dtype=q_dtype, device=x.device)
    scale = torch.empty((m, 1) if per_token else (1,), dtype=torch.float32, device=x.device)
    block = min(MAX_BLOCK, max(16, triton.next_power_of_2(k)))
    amax = scale
    if not per_token:
        amax = torch.zeros(1, dtype=torch.float32, device=x.device)
        if m * k == 0:
            scale.fill_(EPS / qmax)
            return q, scale
        _row_absmax_kernel[(m,)](x, amax, k, x.stride(0), BLOCK=block,
                                 num_warps=num_warps_for(block))
    if m == 0:
        return q, scale
    _quantize_kernel[(m,)](
        x, q, scale, amax, k, x.stride(0), q.stride(0),
        QMAX=qmax, EPS_=EPS, PER_TOKEN=per_token, IS_INT=not q_dtype.is_floating_point,
        BLOCK=block, ONE_PASS=k <= block, num_warps=num_warps_for(block),
    )
    return q, scale


def quantize_int8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (fp32/fp16/bf16) -> (q int8 [M, K], scale fp32 [M, 1]); see the module doc."""
    return _launch(x, torch.int8, INT8_MAX, True, "quantize_int8_per_token")


def quantize_fp8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q float8_e4m3fn [M, K], scale fp32 [M, 1]); see the module doc."""
    return _launch(x, FP8_DTYPE, FP8_MAX, True, "quantize_fp8_per_token")


def quantize_fp8_per_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q float8_e4m3fn [M, K], scale fp32 [1]); see the module doc."""
    return _launch(x, FP8_DTYPE, FP8_MAX, False, "quantize_fp8_per_tensor")


def quantize_fp8(x: torch.Tensor, per_token: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 per token (scale [M, 1]) or per tensor (scale [1])."""
    return quantize_fp8_per_token(x) if per_token else quantize_fp8_per_tensor(x)


# -- references -------------------------------------------------------------------------------
def _scale_ref(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """max(amax, EPS) / qmax, an IEEE fp32 division on every device. Not `amax / qmax`: with a
    Python number as divisor PyTorch's CUDA kernel computes amax * fp32(1 / qmax), 1 ulp off the
    quotient for ~55% of bf16 amax values at qmax 448 (~5% at 127), so its scales (and the q)
    differed from the kernels' and from the same reference on the CPU."""
    amax = amax.float().clamp_min(EPS)
    return amax / torch.full_like(amax, qmax)


def _row_amax(xf: torch.Tensor) -> torch.Tensor:
    if xf.shape[1] == 0:
        return torch.zeros(xf.shape[0], 1, dtype=torch.float32, device=xf.device)
    return xf.abs().amax(dim=-1, keepdim=True)


def quantize_int8_per_token_ref(
    x: torch.Tensor, *, amax: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`amax` [M, 1] replaces the rows' own maxima (a tensor-parallel shard quantized with the
    whole row's scale, lab/quant/base.py `weight_amax`)."""
    xf = x.float()
    scale = _scale_ref(_row_amax(xf) if amax is None else amax, INT8_MAX)
    q = torch.round(xf / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def quantize_fp8_per_token_ref(
    x: torch.Tensor, *, amax: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`amax` [M, 1]: as in quantize_int8_per_token_ref."""
    xf = x.float()
    scale = _scale_ref(_row_amax(xf) if amax is None else amax, FP8_MAX)
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def quantize_fp8_per_tensor_ref(
    x: torch.Tensor, *, amax: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`amax` (one value) replaces the tensor's own maximum (see quantize_int8_per_token_ref)."""
    xf = x.float()
    if amax is None:
        amax = xf.abs().amax() if x.numel() else torch.zeros((), device=x.device)
    scale = _scale_ref(amax, FP8_MAX).reshape(1)
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def quantize_fp8_ref(x: torch.Tensor, per_token: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of `quantize_fp8`."""
    return quantize_fp8_per_token_ref(x) if per_token else quantize_fp8_per_tensor_ref(x)
