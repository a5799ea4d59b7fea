"""Block-copy kernel (Triton interpreter on CPU) against its PyTorch reference, bit-exact for
every cache layout and dtype (fp8 and bf16 included: blocks move as same-width integers)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.kernels.copy_blocks import copy_blocks, copy_blocks_ref

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn]


def _cache(leading, num_blocks, inner, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*leading, num_blocks, *inner, generator=g).to(dtype)


@settings(max_examples=20)
@given(leading=st.sampled_from([(), (2,)]), inner=st.sampled_from([(4, 2, 8), (3, 24), (1, 16)]),
       dtype=st.sampled_from(DTYPES), n_src=st.integers(2, 12), n_dst=st.integers(2, 12),
       data=st.data())
def test_copy_blocks_matches_reference(leading, inner, dtype, n_src, n_dst, data):
    n = data.draw(st.integers(0, min(n_src, n_dst)))
    src_ids = torch.tensor(data.draw(st.permutations(range(n_src)))[:n], dtype=torch.long)
    dst_ids = torch.tensor(data.draw(st.permutations(range(n_dst)))[:n], dtype=torch.int32)
    src = _cache(leading, n_src, inner, dtype, 1)
    dst, want = _cache(leading, n_dst, inner, dtype, 2), _cache(leading, n_dst, inner, dtype, 2)
    block_dim = len(leading)
    copy_blocks(src, dst, src_ids, dst_ids, block_dim)
    copy_blocks_ref(src, want, src_ids, dst_ids, block_dim)
    assert torch.equal(dst.view(torch.uint8), want.view(torch.uint8))
    for s, d in zip(src_ids.tolist(), dst_ids.tolist()):  # and the reference is right
        assert torch.equal(want.select(block_dim, d).view(torch.uint8),
                           src.select(block_dim, s).view(torch.uint8))


def test_untouched_blocks_keep_their_bytes():
    src, dst = _cache((2,), 4, (4, 8), torch.float16, 3), _cache((2,), 6, (4, 8), torch.float16, 4)
    before = dst.clone()
    copy_blocks(src, dst, torch.tensor([3]), torch.tensor([5]), 1)
    assert torch.equal(dst[:, :5], before[:, :5]) and torch.equal(dst[:, 5], src[:, 3])


@pytest.mark.parametrize("fn", [copy_blocks, copy_blocks_ref])
def test_bad_inputs_are_named(fn):
    a = torch.zeros(2, 4, 8)
    with pytest.raises(ValueError, match="dtype and device"):
        fn(a, torch.zeros(2, 4, 8, dtype=torch.float16), torch.tensor([0]), torch.tensor([0]), 1)
    with pytest.raises(ValueError, match="differ outside the block dim"):
        fn(a, torch.zeros(2, 4, 4), torch.tensor([0]), torch.tensor([0]), 1)
    with pytest.raises(ValueError, match="equal length"):
        fn(a, torch.zeros(2, 4, 8), torch.tensor([0, 1]), torch.tensor([0]), 1)
    with pytest.raises(ValueError, match="block_dim"):
        fn(a, torch.zeros(2, 4, 8), torch.tensor([0]), torch.tensor([0]), 3)


def test_non_contiguous_cache_is_refused():
    a = torch.zeros(4, 2, 8).transpose(0, 1)
    with pytest.raises(ValueError, match="contiguous"):
        copy_blocks(a, torch.zeros(2, 4, 8), torch.tensor([0]), torch.tensor([0]), 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_copy_blocks_cuda_bf16_and_fp8():
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        src = _cache((2,), 64, (16, 8, 128), dtype, 5).cuda()
        dst = torch.zeros_like(src)
        ids = torch.randperm(64, device="cuda")[:20]
        copy_blocks(src, dst, ids, ids.flip(0), 1)
        assert torch.equal(dst[:, ids.flip(0)].view(torch.uint8), src[:, ids].view(torch.uint8))
