"""The fp8 KV-cache scheme shared by every KV-write and attention kernel and their references.

fp8 KV cache (`cache.dtype=fp8`): the cache tensors are float8 e4m3fn (1 byte per element, so a
block costs 1/2 of bf16's bytes and 1/4 of fp32's) with two fp32 scales per layer, [num_layers, 2]:
K and V for GQA/MHA, kv_c and k_pe for MLA's latent row. The scales live beside the cache tensors
(`lab.attention.base.KVScales`, made by `AttentionBackend.allocate_kv_cache`).
Scheme (`calibrate_kv_scale`): the first forward that writes a layer after the cache is allocated
sets that layer's scales from the amax of the step's rows, on the device (no host sync):

    scale = 2 ** ceil(log2(max(amax, 2**-20) * HEADROOM / 448)),   HEADROOM = 2

i.e. a power of two with 2x-4x headroom over the first step's largest value; fixed afterwards
(prefix caching and swap copy blocks bit for bit, so cached rows never need rescaling). Writes
store fp8(clamp(x / scale, +-448)) (round to nearest even, saturating); reads use q_fp8 * scale.
A power-of-two scale makes both the division and the product exact, so folding the K scale into
the softmax scale and the V scale into the output (what the Triton kernels do) is exact too.
The profiling forward on CUDA runs on a throw-away cache with its own scales; the real cache gets
fresh ones, so calibration happens on the first real step.

Plain PyTorch (no Triton): the references here are what the kernels are checked against.
"""

from __future__ import annotations

import torch

FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_KV_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
KV_SCALE_HEADROOM = 2.0


def calibrate_kv_scale(x: torch.Tensor) -> torch.Tensor:
    """The fp8 scale (fp32 [1], on x's device) for rows like x: see the module docstring."""
    amax = x.detach().abs().amax().float().clamp_min(2.0**-20).reshape(1)
    return torch.exp2(torch.ceil(torch.log2(amax * (KV_SCALE_HEADROOM / FP8_KV_MAX))))


def quantize_kv_ref(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Reference fp8 store: fp8(clamp(x / scale, +-448)), round to nearest even."""
    return (x.float() / scale.float()).clamp(-FP8_KV_MAX, FP8_KV_MAX).to(FP8_KV_DTYPE)


def dequantize_kv_ref(q: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """Reference fp8 load: q * scale in fp32 (a non-fp8 cache is only upcast)."""
    if q.dtype != FP8_KV_DTYPE:
        return q.float()
    return q.float() * (scale.float() if scale is not None else 1.0)
