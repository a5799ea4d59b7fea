"""W4A16 GEMM: group-wise int4 weights, 16-bit activations (Triton + PyTorch reference), with the
packing helpers and the round-to-nearest quantizer used at load time.

Weight format (N output rows, K input columns, group size G along K, K % G == 0):

    w_packed uint8 [N, K // 2]: byte j of row n holds q[n, 2j] (low nibble) and q[n, 2j + 1]
                                (high nibble), q in 0..15 (`pack_int4` / `unpack_int4`);
    scales [N, K // G]        : fp32 or the activation dtype;
    zeros  [N, K // G] | None : zero points in quantized units (any int or float dtype; the
                                quantizer gives uint8 0..15); None = symmetric, zero point 8.
    dequant(W)[n, k] = (q[n, k] - z[n, k // G]) * s[n, k // G]
    w4a16_gemm(x [M, K]) = x @ dequant(W)^T (+ bias [N]), fp32 accumulation, out in x.dtype.

Kernel: 2-D grid (GROUP_M-swizzled M x N tiles, SPLIT_K). Each program walks its share of the
K blocks (BLOCK_K divides G, so one scale/zero per column per block), loads the packed bytes of a
[BLOCK_K, BLOCK_N] tile of W^T (each byte feeds two k), unpacks by shifting by 4 * (k % 2),
dequantizes in registers to x's dtype and accumulates tl.dot in fp32. SPLIT_K > 1 (small M:
too few tiles to fill the SMs) writes fp32 partial sums to a [SPLIT_K, M, N] buffer and a second
kernel sums them (+ bias) and casts: deterministic, and it runs in the interpreter too.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from lab.kernels import check_dtype_supported, interpreter_active
from lab.kernels.tiles import grouped_tile


@triton.jit
def _w4a16_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, bias_ptr, c_ptr,
    M, N, K,
    stride_xm, stride_wn, stride_sn, stride_zn, stride_cs, stride_cm,
    GROUP: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One BLOCK_M x BLOCK_N tile of x @ dequant(W)^T over split program_id(1) of the K blocks.
    SPLIT_K == 1: stores the final tile (+ bias) in c's dtype; else fp32 partials at
    c_ptr + split * stride_cs."""
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = grouped_tile(pid, num_m, num_n, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows = (offs_m % M).to(tl.int64)
    cols = (offs_n % N).to(tl.int64)
    x_ptrs = x_ptr + rows[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + cols[None, :] * stride_wn + (offs_k // 2)[:, None]  # [BLOCK_K, BLOCK_N]
    shift = ((offs_k % 2) * 4)[:, None]
    s_ptrs = s_ptr + cols * stride_sn
    z_ptrs = z_ptr + cols * stride_zn

    k_blocks = K // BLOCK_K
    per_split = tl.cdiv(k_blocks, SPLIT_K)
    kb_start = pid_k * per_split
    kb_end = tl.minimum(kb_start + per_split, k_blocks)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for kb in range(kb_start, kb_end):
        k0 = kb * BLOCK_K
        x = tl.load(x_ptrs + k0)
        packed = tl.load(w_ptrs + k0 // 2).to(tl.int32)
        q = ((packed >> shift) & 0xF).to(tl.float32)
        g = k0 // GROUP
        s = tl.load(s_ptrs + g).to(tl.float32)
        if HAS_ZEROS:
            z = tl.load(z_ptrs + g).to(tl.float32)
        else:
            z = tl.full([BLOCK_N], 8.0, tl.float32)
        w = ((q - z[None, :]) * s[None, :]).to(x.dtype)
        acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)

    c_mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    c_ptrs = c_ptr + pid_k * stride_cs + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc = acc + tl.load(bias_ptr + cols).to(tl.float32)[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)
    else:
        tl.store(c_ptrs, acc, mask=c_mask)


@triton.jit
def _split_k_reduce_kernel(p_ptr, bias_ptr, c_ptr, MN, N, SPLIT_K: tl.constexpr,
                           HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """c.flat[i] = sum_s p[s].flat[i] (+ bias[i % N]), cast to c's dtype (c, p contiguous)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(SPLIT_K):
        acc += tl.load(p_ptr + s * MN + offs, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs % N, mask=ok, other=0.0).to(tl.float32)
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=ok)


@functools.lru_cache(maxsize=8)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def pick_config(m: int, n: int, k: int, group_size: int, num_sms: int = 132) -> dict:
    """Tiles for H100/H200 (sm_90), by M; BLOCK_K is then halved until it divides group_size.

    M <= 16 (decode): BLOCK_M 16 (smallest MMA), BLOCK_N 64, BLOCK_K 128, and split-K until the
    grid has ~2 programs per SM (4096 x 14336: 224 tiles -> SPLIT_K 2): the step streams 0.5 byte
    per weight, so it needs every SM loading. M <= 64: 32/64 x 64 x 128, split-K the same way.
    M <= 256: 64 x 128 x 64. Larger: 128 x 128 x 64, 8 warps, GROUP_M 8 (compute-bound; the
    dequantization costs ALU per weight tile, amortised over BLOCK_M rows).
    """
    if m <= 16:
        cfg = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=4)
    elif m <= 64:
        cfg = dict(BLOCK_M=32 if m <= 32 else 64, BLOCK_N=64, BLOCK_K=128, GROUP_M=4,
                   num_warps=4, num_stages=4)
    elif m <= 256:
        cfg = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4)
    else:
        cfg = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
    cfg["BLOCK_N"] = min(cfg["BLOCK_N"], max(16, triton.next_power_of_2(n)))
    while group_size % cfg["BLOCK_K"]:
        cfg["BLOCK_K"] //= 2
    tiles = triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"])
    split = 1
    if m <= 64 and tiles < 2 * num_sms:
        split = min(16, k // cfg["BLOCK_K"], triton.cdiv(2 * num_sms, tiles))
    cfg["SPLIT_K"] = max(1, split)
    return cfg


def _interpreter_config(m: int, n: int, group_size: int) -> dict:
    """Few, large tiles (the interpreter's cost is per op); BLOCK_K divides the group."""
    bk = 128
    while group_size % bk:
        bk //= 2
    return dict(BLOCK_M=min(64, max(16, triton.next_power_of_2(m))),
                BLOCK_N=min(128, max(16, triton.next_power_of_2(n))), BLOCK_K=bk, GROUP_M=1,
                SPLIT_K=1, num_warps=4, num_stages=1)


def _check_args(x, w_packed, scales, zeros, group_size, bias) -> None:
    if x.dim() != 2:
        raise ValueError(f"w4a16_gemm: x must be [M, K], got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"w4a16_gemm: x must be fp32, fp16 or bf16, got {x.dtype}")
    m, k = x.shape
    if w_packed.dtype != torch.uint8 or w_packed.dim() != 2 or 2 * w_packed.shape[1] != k:
        raise ValueError(f"w4a16_gemm: w_packed must be uint8 [N, K/2={k / 2:g}], got "
                         f"{w_packed.dtype} {tuple(w_packed.shape)}")
    n = w_packed.shape[0]
    if group_size < 16 or group_size % 16:
        raise ValueError(f"w4a16_gemm: group_size must be a multiple of 16 (the smallest dot "
                         f"K tile), got {group_size}")
    if k % group_size:
        raise ValueError(f"w4a16_gemm: K={k} must be a multiple of group_size={group_size}")
    if scales.shape != (n, k // group_size):
        raise ValueError(f"w4a16_gemm: scales must be [N={n}, K/G={k // group_size}], got "
                         f"{tuple(scales.shape)}")
    if scales.dtype not in (torch.float32, x.dtype):
        raise ValueError(f"w4a16_gemm: scales must be fp32 or x's dtype {x.dtype}, got "
                         f"{scales.dtype}")
    if zeros is not None and zeros.shape != scales.shape:
        raise ValueError(f"w4a16_gemm: zeros must be [N={n}, K/G={k // group_size}] like scales, "
                         f"got {tuple(zeros.shape)}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != n):
        raise ValueError(f"w4a16_gemm: bias must be [N={n}], got {tuple(bias.shape)}")
    for what, t in (("w_packed", w_packed), ("scales", scales), ("zeros", zeros), ("bias", bias)):
        if t is None:
            continue
        if t.device != x.device:
            raise ValueError(f"w4a16_gemm: {what} is on {t.device}, x on {x.device}")
        if t.dim() == 2 and t.stride(-1) != 1:
            raise ValueError(f"w4a16_gemm: {what} must be contiguous in its last dim "
                             f"(stride {t.stride()})")
    check_dtype_supported(x, "w4a16_gemm x")


def w4a16_gemm(
    x: torch.Tensor,
    w_packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    group_size: int,
    bias: torch.Tensor | None = None,
    *,
    config: dict | None = None,
) -> torch.Tensor:
    """x [M, K] @ dequant(W)^T (+ bias) -> [M, N] in x.dtype (Triton); format in the module doc.
    `config` overrides tile entries (BLOCK_M/N/K powers of two >= 16, BLOCK_K dividing
    group_size; GROUP_M; SPLIT_K >= 1; num_warps; num_stages) for tests and tuning."""
    _check_args(x, w_packed, scales, zeros, group_size, bias)
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, k = x.shape
    n = w_packed.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_() if bias is None else out.copy_(bias.to(x.dtype).expand(m, n))
    if interpreter_active():
        cfg = _interpreter_config(m, n, group_size)
    else:
        cfg = pick_config(m, n, k, group_size, _num_sms(x.device.index or 0))
    cfg.update(config or {})
    for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        if cfg[key] < 16 or cfg[key] & (cfg[key] - 1):
            raise ValueError(f"config {key} must be a power of two >= 16, got {cfg[key]}")
    if group_size % cfg["BLOCK_K"]:
        raise ValueError(f"config BLOCK_K={cfg['BLOCK_K']} must divide group_size={group_size}")
    split = max(1, min(int(cfg.pop("SPLIT_K")), k // cfg["BLOCK_K"]))
    dst = out if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]), split)
    _w4a16_kernel[grid](
        x, w_packed, scales, zeros if zeros is not None else scales,
        bias if bias is not None else scales, dst,
        m, n, k,
        x.stride(0), w_packed.stride(0), scales.stride(0),
        (zeros if zeros is not None else scales).stride(0), m * n if split > 1 else 0, n,
        GROUP=group_size, HAS_ZEROS=zeros is not None, HAS_BIAS=bias is not None,
        SPLIT_K=split,
        DOT_PRECISION="tf32x3" if x.dtype == torch.float32 else "tf32",
        **cfg,
    )
    if split > 1:
        block = 1024
        _split_k_reduce_kernel[(triton.cdiv(m * n, block),)](
            dst, bias if bias is not None else dst, out, m * n, n, SPLIT_K=split,
            HAS_BIAS=bias is not None, BLOCK=block, num_warps=4)
    return out


# -- packing, quantizer, reference -------------------------------------------------------------
def pack_int4(w_q: torch.Tensor) -> torch.Tensor:
    """w_q [N, K] integers in 0..15 (K even) -> uint8 [N, K // 2], low nibble = even k."""
    if w_q.dim() != 2 or w_q.shape[1] % 2:
        raise ValueError(f"pack_int4: w_q must be [N, K] with K even, got {tuple(w_q.shape)}")
    if w_q.is_floating_point() or w_q.is_complex() or w_q.dtype == torch.bool:
        raise ValueError(f"pack_int4: w_q must be an integer tensor, got {w_q.dtype}")
    if w_q.numel() and (int(w_q.min()) < 0 or int(w_q.max()) > 15):
        raise ValueError("pack_int4: values must lie in 0..15")
    w = w_q.to(torch.uint8)
    return (w[:, 0::2] | (w[:, 1::2] << 4)).contiguous()


def unpack_int4(w_packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K // 2] -> uint8 [N, K] in 0..15 (inverse of `pack_int4`)."""
    if w_packed.dtype != torch.uint8 or w_packed.dim() != 2:
        raise ValueError(f"unpack_int4: w_packed must be uint8 [N, K/2], got {w_packed.dtype} "
                         f"{tuple(w_packed.shape)}")
    return torch.stack((w_packed & 0xF, w_packed >> 4), dim=-1).reshape(w_packed.shape[0], -1)


def quantize_w4(w: torch.Tensor, group_size: int = 128, symmetric: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Round-to-nearest int4 quantization of w [N, K] by groups of `group_size` along K.

    symmetric: s = amax / 7, q = clamp(round(w / s), -8, 7) + 8 (zero point 8, zeros None).
    asymmetric: s = (max - min) / 15 over the group with min <= 0 <= max,
    z = clamp(round(-min / s), 0, 15), q = clamp(round(w / s) + z, 0, 15); zeros uint8.
    Returns (packed uint8 [N, K/2], scales [N, K/G] in w's dtype, zeros uint8 [N, K/G] | None).
    """
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"quantize_w4: w must be a floating [N, K] tensor, got {w.dtype} "
                         f"{tuple(w.shape)}")
    n, k = w.shape
    if group_size <= 0 or k % group_size or k % 2:
        raise ValueError(f"quantize_w4: K={k} must be even and a multiple of "
                         f"group_size={group_size}")
    wg = w.float().reshape(n, k // group_size, group_size)
    if symmetric:
        s = (wg.abs().amax(-1) / 7).clamp_min(1e-10)
        q = torch.round(wg / s[..., None]).clamp(-8, 7) + 8
        z = None
    else:
        lo = wg.amin(-1).clamp(max=0)
        hi = wg.amax(-1).clamp(min=0)
        s = ((hi - lo) / 15).clamp_min(1e-10)
        zf = torch.round(-lo / s).clamp(0, 15)
        q = (torch.round(wg / s[..., None]) + zf[..., None]).clamp(0, 15)
        z = zf.to(torch.uint8)
    packed = pack_int4(q.reshape(n, k).to(torch.uint8))
    return packed, s.to(w.dtype), z


def dequantize_w4(w_packed, scales, zeros, group_size: int) -> torch.Tensor:
    """fp32 [N, K] = (q - z) * s (zero point 8 when zeros is None)."""
    q = unpack_int4(w_packed).float()
    z = 8.0 if zeros is None else zeros.float().repeat_interleave(group_size, dim=1)
    return (q - z) * scales.float().repeat_interleave(group_size, dim=1)


def w4a16_gemm_ref(x, w_packed, scales, zeros, group_size: int, bias=None) -> torch.Tensor:
    """PyTorch reference: dequantize in fp32, fp32 matmul, + bias, cast to x.dtype."""
    out = x.float() @ dequantize_w4(w_packed, scales, zeros, group_size).T
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)
