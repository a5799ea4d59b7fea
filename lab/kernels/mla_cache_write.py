"""MLA latent-cache write: scatter the step's | kv_c | k_pe | rows into the paged latent cache.

Cache layout per layer: kv_cache [num_blocks, block_size, L + R]; token t's row goes to block
slot // block_size, offset slot % block_size, laid out | kv_c (L, normalised) | k_pe (R, rotated) |.
Slots < 0 (padding) are skipped; values are cast to the cache dtype on store.

Grid (cdiv(T, BLOCK_T),): one program writes BLOCK_T whole rows; the row width is padded to a
power of two (BLOCK_W >= L + R, masked), so L and R need not be powers of two (DeepSeek: 512 + 64).
The PyTorch reference is `write_latent_cache_ref` below (the `attention=torch` path).

fp8 cache (float8 e4m3fn, scheme in lab/kernels/fp8_kv.py): kv_c is stored as fp8(kv_c / c_scale)
and k_pe as fp8(k_pe / pe_scale) (clamped to +-448, round to nearest even, IEEE division),
bit-identical to the reference; the e4m3 rounding is done in fp32 first (see kv_cache_write.py),
so this runs in the interpreter too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lab.kernels import interpreter_active, num_warps_for
from lab.kernels.fp8_kv import FP8_KV_DTYPE, quantize_kv_ref
from lab.kernels.kv_cache_write import _scale_arg, _to_fp8_grid

_MAX_TILE = 4096  # elements per program on a GPU


@triton.jit
def _latent_write_kernel(
    c_ptr, pe_ptr, cache_ptr, slot_ptr, c_scale_ptr, pe_scale_ptr, num_tokens, lora, rope,
    stride_ct, stride_pt, stride_cb, stride_co,
    BLOCK_SIZE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, FP8: tl.constexpr,
):
    toks = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    slot = tl.load(slot_ptr + toks, mask=toks < num_tokens, other=-1).to(tl.int64)
    valid = slot >= 0
    cols = tl.arange(0, BLOCK_W)
    is_c = cols < lora
    is_pe = (cols >= lora) & (cols < lora + rope)
    t64 = toks.to(tl.int64)
    c = tl.load(c_ptr + t64[:, None] * stride_ct + cols[None, :],
                mask=valid[:, None] & is_c[None, :], other=0.0)
    pe = tl.load(pe_ptr + t64[:, None] * stride_pt + (cols - lora)[None, :],
                 mask=valid[:, None] & is_pe[None, :], other=0.0)
    if FP8:
        c = _to_fp8_grid(c, tl.load(c_scale_ptr))
        pe = _to_fp8_grid(pe, tl.load(pe_scale_ptr))
    row = tl.where(is_c[None, :], c, pe)
    dst = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_co
    tl.store(cache_ptr + dst[:, None] + cols[None, :], row.to(cache_ptr.dtype.element_ty),
             mask=valid[:, None] & (is_c | is_pe)[None, :])


def write_latent_cache(
    kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
    c_scale: torch.Tensor | float | None = None, pe_scale: torch.Tensor | float | None = None,
) -> None:
    """Write rows | kv_c [T, L] | k_pe [T, R] | into kv_cache [num_blocks, block_size, L + R]
    at slot_mapping [T] (slots < 0 skipped); an fp8 cache is quantized with c_scale / pe_scale
    (fp32 [1]; None: 1.0)."""
    _check_args(kv_c, k_pe, kv_cache, slot_mapping)
    t, lora = kv_c.shape
    rope = k_pe.shape[1]
    if t == 0:
        return
    width = triton.next_power_of_2(lora + rope)
    fp8 = kv_cache.dtype == FP8_KV_DTYPE
    if fp8:
        c_scale, pe_scale = _scale_arg(c_scale, kv_c), _scale_arg(pe_scale, kv_c)
    else:
        c_scale = pe_scale = slot_mapping  # unused pointers
    cap = 1 << 16 if interpreter_active() else _MAX_TILE  # the interpreter pays per program
    block_t = max(1, min(triton.next_power_of_2(t), cap // width))
    _latent_write_kernel[(triton.cdiv(t, block_t),)](
        kv_c, k_pe, kv_cache, slot_mapping, c_scale, pe_scale, t, lora, rope,
        kv_c.stride(0), k_pe.stride(0), kv_cache.stride(0), kv_cache.stride(1),
        BLOCK_SIZE=kv_cache.shape[1], BLOCK_T=block_t, BLOCK_W=width, FP8=fp8,
        num_warps=num_warps_for(block_t * width),
    )


def _check_args(kv_c, k_pe, kv_cache, slot_mapping) -> None:
    if kv_c.dim() != 2 or k_pe.dim() != 2 or kv_cache.dim() != 3:
        raise ValueError(f"expected kv_c [T, L], k_pe [T, R], kv_cache [N, block_size, L + R]; "
                         f"got {tuple(kv_c.shape)}, {tuple(k_pe.shape)}, {tuple(kv_cache.shape)}")
    t = kv_c.shape[0]
    if k_pe.shape[0] != t or slot_mapping.shape != (t,):
        raise ValueError(f"kv_c, k_pe and slot_mapping must have {t} tokens")
    if kv_cache.shape[2] != kv_c.shape[1] + k_pe.shape[1]:
        raise ValueError(f"kv_cache rows hold {kv_cache.shape[2]} values, not L + R = "
                         f"{kv_c.shape[1]} + {k_pe.shape[1]}")
    for name, x in (("kv_c", kv_c), ("k_pe", k_pe), ("kv_cache", kv_cache)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")


def write_latent_cache_ref(
    kv_cache: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor, slot_mapping: torch.Tensor,
    c_scale: torch.Tensor | None = None, pe_scale: torch.Tensor | None = None,
) -> None:
    """Reference latent write: row | kv_c [T, L] | k_pe [T, R] | of token t goes to slot
    slot_mapping[t] (block slot // block_size, offset slot % block_size); slots < 0 are skipped.
    An fp8 cache stores | kv_c / c_scale | k_pe / pe_scale | (fp32 [1] scales; None: 1.0)."""
    num_blocks, block_size, width = kv_cache.shape
    valid = slot_mapping >= 0
    if kv_cache.dtype == FP8_KV_DTYPE:
        one = torch.ones(1, dtype=torch.float32, device=kv_c.device)
        rows = torch.cat((quantize_kv_ref(kv_c[valid], one if c_scale is None else c_scale),
                          quantize_kv_ref(k_pe[valid], one if pe_scale is None else pe_scale)),
                         dim=-1)
    else:
        rows = torch.cat((kv_c[valid], k_pe[valid]), dim=-1).to(kv_cache.dtype)
    kv_cache.view(num_blocks * block_size, width)[slot_mapping[valid]] = rows
