"""MLA latent-cache write kernel (Triton interpreter on CPU) against the PyTorch reference of the
torch backend (`write_latent_cache_ref`, beside it), bit-exact in fp32/fp16."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.kernels.mla_cache_write import write_latent_cache, write_latent_cache_ref


@settings(max_examples=20)
@given(t=st.integers(1, 40), lora=st.sampled_from([8, 24, 32, 48]), rope=st.sampled_from([4, 8, 16]),
       block_size=st.sampled_from([1, 4, 16]), dtype=st.sampled_from([torch.float32, torch.float16]),
       data=st.data())
def test_latent_write_matches_reference(t, lora, rope, block_size, dtype, data):
    num_blocks = (t + block_size - 1) // block_size + 2
    slots = data.draw(st.permutations(range(num_blocks * block_size)))[:t]
    pad = data.draw(st.lists(st.integers(0, t - 1), max_size=3))  # some padding tokens
    slot_mapping = torch.tensor([-1 if i in pad else s for i, s in enumerate(slots)])
    g = torch.Generator().manual_seed(t)
    kv_a = torch.randn(t, lora + rope + 3, generator=g)  # views with a row stride > L, like
    kv_c, k_pe = kv_a[:, :lora], kv_a[:, lora:lora + rope]  # the model's split projection
    cache = torch.randn(num_blocks, block_size, lora + rope, generator=g).to(dtype)
    want = cache.clone()
    write_latent_cache(kv_c, k_pe, cache, slot_mapping)
    write_latent_cache_ref(want, kv_c, k_pe, slot_mapping)
    assert torch.equal(cache, want)


def test_bad_shapes_are_named():
    cache = torch.zeros(4, 4, 24)
    with pytest.raises(ValueError, match="L \\+ R"):
        write_latent_cache(torch.zeros(2, 16), torch.zeros(2, 4), cache, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="tokens"):
        write_latent_cache(torch.zeros(2, 16), torch.zeros(2, 8), cache, torch.tensor([0]))
