"""`write_kv_cache` (Triton) against its PyTorch reference; interpreter on CPU, bf16 on CUDA."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lab.kernels  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before kernel modules load)
from lab.kernels.kv_cache_write import write_kv_cache, write_kv_cache_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # interpreter on CPU
SENTINEL = -1234.0  # exactly representable in fp16/bf16/fp32; randn never produces it


def _slots(num_tokens, num_blocks, block_size, pad_every, gen):
    """Distinct slots scattered over blocks 1..num_blocks-1 (block 0 is the null block);
    every `pad_every`-th token (0: none) is padding (-1)."""
    slots = torch.randperm((num_blocks - 1) * block_size, generator=gen)[:num_tokens] + block_size
    if pad_every:
        slots[::pad_every] = -1
    return slots


def _run_both(k, v, kv_cache, slots, device=DEVICE):
    """Kernel and reference on two sentinel-filled copies of kv_cache [2, N, bs, H, D]."""
    k, v, kv_cache, slots = k.to(device), v.to(device), kv_cache.to(device), slots.to(device)
    got, want = kv_cache.clone(), kv_cache.clone()
    write_kv_cache(k, v, got[0], got[1], slots)
    write_kv_cache_ref(k, v, want[0], want[1], slots)
    return got, want


def _assert_untouched_except(cache, slots):
    """Every slot not in `slots` (valid ones) still holds the sentinel in K and V."""
    n, bs = cache.shape[1], cache.shape[2]
    written = torch.zeros(n * bs, dtype=torch.bool, device=cache.device)
    slots = slots.to(cache.device)
    written[slots[slots >= 0]] = True
    rest = cache.flatten(1, 2)[:, ~written]
    assert torch.all(rest == SENTINEL)


@settings(max_examples=20)
@given(
    block_size=st.integers(1, 32),
    num_kv_heads=st.integers(1, 4),
    head_dim=st.sampled_from([16, 32, 64]),
    num_tokens=st.integers(1, 40),
    extra_blocks=st.integers(0, 3),
    pad_every=st.sampled_from([0, 2, 3, 7]),
    src_dtype=st.sampled_from([torch.float32, torch.float16]),
    cache_dtype=st.sampled_from([torch.float32, torch.float16]),
    seed=st.integers(0, 2**31 - 1),
)
def test_write_matches_reference(
    block_size, num_kv_heads, head_dim, num_tokens, extra_blocks, pad_every,
    src_dtype, cache_dtype, seed,
):
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 1 + -(-num_tokens // block_size) + extra_blocks
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(src_dtype)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(src_dtype)
    cache = torch.full((2, num_blocks, block_size, num_kv_heads, head_dim), SENTINEL,
                       dtype=cache_dtype)
    slots = _slots(num_tokens, num_blocks, block_size, pad_every, gen)
    got, want = _run_both(k, v, cache, slots)
    assert torch.equal(got, want)
    _assert_untouched_except(got, slots)
    valid = slots >= 0
    flat = got.flatten(1, 2).cpu()
    assert torch.equal(flat[0, slots[valid]], k[valid].to(cache_dtype))
    assert torch.equal(flat[1, slots[valid]], v[valid].to(cache_dtype))


def test_d128_strided_inputs():
    """d=128, 8 KV heads, block 16; k/v are non-contiguous views of one fused qkv tensor."""
    gen = torch.Generator().manual_seed(0)
    t, h, hkv, d, bs, n = 21, 16, 8, 128, 16, 5
    qkv = torch.randn(t, h + 2 * hkv, d, generator=gen)
    k, v = qkv[:, h:h + hkv], qkv[:, h + hkv:]
    cache = torch.full((2, n, bs, hkv, d), SENTINEL, dtype=torch.float16)
    slots = _slots(t, n, bs, 5, gen)
    got, want = _run_both(k, v, cache, slots)
    assert torch.equal(got, want)
    _assert_untouched_except(got, slots)


def test_many_heads_split_across_programs():
    """Hkv * D above one program's tile: heads are split over grid axis 1 with a masked tail."""
    gen = torch.Generator().manual_seed(1)
    t, hkv, d, bs, n = 6, 24, 128, 3, 4
    k = torch.randn(t, hkv, d, generator=gen)
    v = torch.randn(t, hkv, d, generator=gen)
    cache = torch.full((2, n, bs, hkv, d), SENTINEL)
    slots = _slots(t, n, bs, 0, gen)
    got, want = _run_both(k, v, cache, slots)
    assert torch.equal(got, want)


def test_all_padding_and_empty_are_noops():
    cache = torch.full((2, 3, 4, 2, 16), SENTINEL, device=DEVICE)
    k = torch.randn(5, 2, 16, device=DEVICE)
    slots = torch.full((5,), -1, dtype=torch.int64, device=DEVICE)
    write_kv_cache(k, k, cache[0], cache[1], slots)
    write_kv_cache(k[:0], k[:0], cache[0], cache[1], slots[:0])
    assert torch.all(cache == SENTINEL)


@pytest.mark.gpu
def test_write_bf16_cuda():
    """bf16 on CUDA at a realistic prefill shape (8k tokens, 8 KV heads, d128, block 16)."""
    gen = torch.Generator().manual_seed(2)
    t, hkv, d, bs = 8192, 8, 128, 16
    n = 1 + t // bs + 8
    k = torch.randn(t, hkv, d, generator=gen).to("cuda", torch.bfloat16)
    v = torch.randn(t, hkv, d, generator=gen).to("cuda", torch.bfloat16)
    cache = torch.full((2, n, bs, hkv, d), SENTINEL, dtype=torch.bfloat16, device="cuda")
    slots = _slots(t, n, bs, 9, gen).cuda()
    got, want = _run_both(k, v, cache, slots)
    assert torch.equal(got, want)
    _assert_untouched_except(got, slots)
