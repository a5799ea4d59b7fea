"""W8A8 int8 GEMM with per-token activation and per-channel weight scales (Triton + PyTorch
reference). Contract of `int8_gemm` / `int8_gemm_ref`:

    a_q int8 [M, K], a_scale fp32 [M, 1] (or [1]: per tensor), w_q int8 [N, K],
    w_scale fp32 [N] (or [1]), bias [N] | None:
    out[m, n] = fp32(sum_k a_q[m, k] * w_q[n, k]) * a_scale[m] * w_scale[n] (+ bias[n]),
    the sum exact in int32, the epilogue in fp32, one rounding to out_dtype.

`_scaled_mm_kernel` also serves `fp8_gemm` (fp8 inputs, fp32 accumulation). Grid: 1-D over
cdiv(M, BLOCK_M) x cdiv(N, BLOCK_N) tiles, GROUP_M-swizzled so a group of M tiles reuses each
weight tile from L2. Rows/columns past M/N are wrapped (% M, % N) so the loads stay unmasked and
only the store is masked; K is masked only when K % BLOCK_K != 0. Tiles by M (`pick_config`).
Triton's interpreter runs the int8 dot exactly (int32 accumulation), so this runs on the CPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lab.kernels import interpreter_active
from lab.kernels.tiles import grouped_tile, load_k_step


@triton.jit
def _scaled_mm_kernel(
    a_ptr, w_ptr, c_ptr, a_scale_ptr, w_scale_ptr, bias_ptr,
    M, N, K,
    stride_am, stride_wn, stride_cm,
    A_PER_ROW: tl.constexpr,
    W_PER_COL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACC_INT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """C = (A @ W^T) * a_scale[:, None] * w_scale[None, :] (+ bias) for one BLOCK_M x BLOCK_N
    tile. A [M, K] and W [N, K] are contiguous in K; the accumulator is int32 (ACC_INT) or fp32."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = grouped_tile(pid, num_m, num_n, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows = (offs_m % M).to(tl.int64)
    cols = (offs_n % N).to(tl.int64)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + cols[None, :] * stride_wn + offs_k[:, None]  # [BLOCK_K, BLOCK_N] of W^T
    if ACC_INT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.int32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for kk in range(0, tl.cdiv(K, BLOCK_K)):
        a, b = load_k_step(a_ptrs, w_ptrs, K - kk * BLOCK_K, offs_k, EVEN_K)
        # out_dtype explicit: Triton <= 3.6 defaults it to fp32 and asserts it equals the int32
        # accumulator's dtype (a CompilationError); later versions take it from `acc`
        acc = tl.dot(a, b, acc, out_dtype=acc.dtype)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K

    out = acc.to(tl.float32)
    if A_PER_ROW:
        out = out * tl.load(a_scale_ptr + rows)[:, None]
    else:
        out = out * tl.load(a_scale_ptr)
    if W_PER_COL:
        out = out * tl.load(w_scale_ptr + cols)[None, :]
    else:
        out = out * tl.load(w_scale_ptr)
    if HAS_BIAS:
        out = out + tl.load(bias_ptr + cols).to(tl.float32)[None, :]
    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, out.to(c_ptr.dtype.element_ty),
             mask=(offs_m < M)[:, None] & (offs_n < N)[None, :])


def pick_config(m: int, n: int, k: int) -> dict:
    """Tiles for H100/H200 (sm_90) and 1-byte inputs, by M.

    Decode (M <= 16): BLOCK_M 16 (the smallest MMA tile), narrow N and a long K step so many
    programs stream the weight with wide loads (bandwidth-bound). M <= 64: 64 x 64 x 128.
    M <= 256: 64 x 128 x 128. Larger: 128 x 256 x 128 (8 warps, 3 stages: 48 KiB of shared memory
    per stage; the wgmma tile of the Triton fp8 tutorial), GROUP_M 8 for L2 reuse of W tiles.
    `n`, `k` cap the tiles for small layers.
    """
    if m <= 16:
        cfg = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, GROUP_M=1, num_warps=4, num_stages=4)
    elif m <= 64:
        cfg = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, GROUP_M=4, num_warps=4, num_stages=4)
    elif m <= 256:
        cfg = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=4)
    else:
        cfg = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=3)
    cfg["BLOCK_N"] = min(cfg["BLOCK_N"], max(16, triton.next_power_of_2(n)))
    cfg["BLOCK_K"] = min(cfg["BLOCK_K"], max(32, triton.next_power_of_2(k)))
    return cfg


def _interpreter_config(m: int, n: int, k: int) -> dict:
    """Few, large tiles: the interpreter's cost is per op, not per element."""
    p2 = lambda v, hi: min(hi, max(16, triton.next_power_of_2(v)))  # noqa: E731
    return dict(BLOCK_M=p2(m, 64), BLOCK_N=p2(n, 128), BLOCK_K=p2(k, 128), GROUP_M=1,
                num_warps=4, num_stages=1)


def check_scaled_mm_args(name, a_q, a_scale, w_q, w_scale, bias, out_dtype, q_dtype) -> None:
    """Shapes, dtypes, devices, layouts as ValueErrors naming the argument (int8 and fp8)."""
    if a_q.dim() != 2 or w_q.dim() != 2:
        raise ValueError(f"{name}: a_q must be [M, K] and w_q [N, K], got {tuple(a_q.shape)} and "
                         f"{tuple(w_q.shape)}")
    m, k = a_q.shape
    n = w_q.shape[0]
    if w_q.shape[1] != k:
        raise ValueError(f"{name}: w_q must be [N, K={k}], got {tuple(w_q.shape)}")
    for what, t in (("a_q", a_q), ("w_q", w_q)):
        if t.dtype != q_dtype:
            raise ValueError(f"{name}: {what} must be {q_dtype}, got {t.dtype}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: {what} must be contiguous in K (stride {t.stride()})")
    if a_scale.dtype != torch.float32 or a_scale.numel() not in (1, m):
        raise ValueError(f"{name}: a_scale must be fp32 [M={m}, 1] or [1], got "
                         f"{a_scale.dtype} {tuple(a_scale.shape)}")
    if w_scale.dtype != torch.float32 or w_scale.numel() not in (1, n):
        raise ValueError(f"{name}: w_scale must be fp32 [N={n}] or [1], got "
                         f"{w_scale.dtype} {tuple(w_scale.shape)}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != n):
        raise ValueError(f"{name}: bias must be [N={n}], got {tuple(bias.shape)}")
    if out_dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"{name}: out_dtype must be fp32, fp16 or bf16, got {out_dtype}")
    if out_dtype == torch.bfloat16 and interpreter_active():
        raise ValueError(f"{name}: out_dtype bfloat16 is not supported by Triton's interpreter; "
                         "use float32 or float16 on CPU (or run on a CUDA device)")
    for what, t in (("a_scale", a_scale), ("w_q", w_q), ("w_scale", w_scale), ("bias", bias)):
        if t is not None and t.device != a_q.device:
            raise ValueError(f"{name}: {what} is on {t.device}, a_q on {a_q.device}")


def scaled_mm(a_q, a_scale, w_q, w_scale, bias, out_dtype, config: dict | None) -> torch.Tensor:
    """Launch `_scaled_mm_kernel` (arguments already checked)."""
    m, k = a_q.shape
    n = w_q.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=a_q.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_() if bias is None else out.copy_(bias.to(out_dtype).expand(m, n))
    cfg = _interpreter_config(m, n, k) if interpreter_active() else pick_config(m, n, k)
    cfg.update(config or {})
    for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        if cfg[key] < 16 or cfg[key] & (cfg[key] - 1):
            raise ValueError(f"config {key} must be a power of two >= 16, got {cfg[key]}")
    a_scale = a_scale.reshape(-1)
    w_scale = w_scale.reshape(-1)
    a_scale = a_scale if a_scale.is_contiguous() else a_scale.contiguous()
    w_scale = w_scale if w_scale.is_contiguous() else w_scale.contiguous()
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
    _scaled_mm_kernel[grid](
        a_q, w_q, out, a_scale, w_scale, bias if bias is not None else w_scale,
        m, n, k, a_q.stride(0), w_q.stride(0), out.stride(0),
        A_PER_ROW=a_scale.numel() == m,
        W_PER_COL=w_scale.numel() == n,
        HAS_BIAS=bias is not None,
        ACC_INT=not a_q.dtype.is_floating_point,
        EVEN_K=k % cfg["BLOCK_K"] == 0,
        **cfg,
    )
    return out


def int8_gemm(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float16,
    *,
    config: dict | None = None,
) -> torch.Tensor:
    """W8A8 int8 GEMM (Triton); contract in the module docstring. `config` overrides tile entries
    (BLOCK_M/N/K: powers of two >= 16, GROUP_M, num_warps, num_stages) for tests and tuning."""
    check_scaled_mm_args("int8_gemm", a_q, a_scale, w_q, w_scale, bias, out_dtype, torch.int8)
    return scaled_mm(a_q, a_scale, w_q, w_scale, bias, out_dtype, config)


def int8_gemm_ref(a_q, a_scale, w_q, w_scale, bias=None, out_dtype=torch.float16) -> torch.Tensor:
    """PyTorch reference: the int32 product exactly (int64 matmul on the CPU; on CUDA an fp64
    matmul, exact for |sum| < 2**53), times the scales in fp32, + bias, cast once."""
    if a_q.device.type == "cpu":
        acc = (a_q.long() @ w_q.long().T).float()
    else:
        acc = (a_q.double() @ w_q.double().T).float()
    out = acc * a_scale.float().reshape(-1, 1) * w_scale.float().reshape(1, -1)
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)
