"""A CPU KV cache is zeroed by the OS on first touch (a cache sized from memory costs what its
requests write), except its first blocks, PREFAULT_BYTES of them over every layer, which the
allocation touches so that a fresh engine's first requests do not take page faults in their
steps (bench_qwen3_06b bf16: 431 -> 472 tok/s on the measurements' VM)."""

import torch

from lab.attention.base import KVCacheSpec, prefault
from lab.attention.spec import AttentionSpec
from lab.attention.torch_backend import TorchAttentionBackend


def test_prefault_touches_the_first_blocks_of_every_layer_along_the_block_dim():
    spec = KVCacheSpec(block_shape=(4, 2, 8), dtype=torch.float32, bytes_per_token=2 * 2 * 8 * 4,
                       block_size=4, leading=(2,))
    layers = [torch.ones(spec.layer_shape(10)) for _ in range(3)]
    prefault(layers, spec, budget=3 * spec.page_bytes * 3)  # three blocks of each of 3 layers
    for layer in layers:
        assert (layer[:, :3] == 0).all() and (layer[:, 3:] == 1).all()
    prefault(layers, spec, budget=10**12)  # more than the cache: all of it
    assert all((layer == 0).all() for layer in layers)


def test_a_cpu_cache_is_all_zeros_prefaulted_or_not():
    backend = TorchAttentionBackend()
    kv_spec = backend.kv_cache_spec(AttentionSpec(num_heads=4, num_kv_heads=2, head_dim=8),
                                    block_size=4, dtype=torch.float32)
    cache = backend.allocate_kv_cache(kv_spec, num_blocks=64, num_layers=2,
                                      device=torch.device("cpu"))
    assert all((layer == 0).all() for layer in cache.layers)
    assert cache.layers[0].shape == kv_spec.layer_shape(64)
