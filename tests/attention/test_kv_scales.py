"""fp8 KV scales live with the cache (KVCache.scales), not in the attention backend: each cache
allocated starts uncalibrated, a layer is calibrated on its first write and fixed afterwards."""

from __future__ import annotations

import pytest
import torch

from lab.attention.base import AttentionInputs, AttentionSpec, KVScales, layer_kv_scales
from lab.attention.torch_backend import TorchAttentionBackend
from lab.kernels.fp8_kv import FP8_KV_DTYPE, calibrate_kv_scale

SPEC = AttentionSpec(num_heads=2, num_kv_heads=1, head_dim=8)


def _inputs(scales: KVScales | None) -> AttentionInputs:
    one = torch.zeros(1, dtype=torch.int32)
    return AttentionInputs(one, one, one, one[None], one.long(), 1, 1, 1, 1, 4, [1], [1],
                           kv_scales=scales)


def test_each_cache_has_its_own_scales_and_the_backend_none():
    backend = TorchAttentionBackend()
    kv_spec = backend.kv_cache_spec(SPEC, 4, FP8_KV_DTYPE)
    first, second = (backend.allocate_kv_cache(kv_spec, 3, 2, torch.device("cpu")) for _ in "ab")
    assert [t.dtype for t in first.layers] == [FP8_KV_DTYPE] * 2 and first.scales is not second.scales
    k, v = torch.full((1, 1, 8), 3.0), torch.full((1, 1, 8), 0.5)
    got = layer_kv_scales(_inputs(first.scales), 1, first.layers[1], k, v)
    assert torch.equal(torch.cat(got), torch.cat((calibrate_kv_scale(k), calibrate_kv_scale(v))))
    assert first.scales.calibrated == [False, True] and second.scales.calibrated == [False, False]
    again = layer_kv_scales(_inputs(first.scales), 1, first.layers[1], 100 * k, v)
    assert torch.equal(torch.cat(again), torch.cat(got))  # fixed after the first write
    assert not any("scale" in name for name in vars(backend))


def test_non_fp8_cache_has_no_scales_and_fp8_needs_them():
    backend = TorchAttentionBackend()
    cache = backend.allocate_kv_cache(backend.kv_cache_spec(SPEC, 4, torch.float32), 3, 1, "cpu")
    assert cache.scales is None
    assert layer_kv_scales(_inputs(None), 0, cache.layers[0], torch.ones(1), torch.ones(1)) == (None, None)
    fp8 = torch.zeros(2, 3, 4, 1, 8, dtype=FP8_KV_DTYPE)
    with pytest.raises(ValueError, match="needs its scales"):
        layer_kv_scales(_inputs(None), 0, fp8, torch.ones(1), torch.ones(1))


def test_scales_grow_to_a_later_layer():
    scales = KVScales(1, "cpu")
    scales.for_layer(2, torch.ones(1), torch.ones(1))
    assert scales.scales.shape == (3, 2) and scales.calibrated == [False, False, True]
