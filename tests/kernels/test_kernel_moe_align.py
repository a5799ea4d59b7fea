"""`moe_align` (Triton, interpreter on CPU) against `moe_align_ref`, and the reference against the
definition: per expert the ascending flat indices t*k+j routed to it, padded to BLOCK_M."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lab.kernels  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before kernel modules load)
from lab.kernels.moe_align import max_num_blocks, moe_align, moe_align_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def routing(t: int, k: int, e: int, seed: int, skew: bool = False) -> torch.Tensor:
    """topk_ids [t, k]: k distinct experts per token; `skew` routes only to experts < ceil(e/2)+k
    (so some experts get nothing)."""
    gen = torch.Generator().manual_seed(seed)
    pool = min(e, (e + 1) // 2 + k) if skew else e
    return torch.stack([torch.randperm(pool, generator=gen)[:k] for _ in range(t)])


def check_definition(topk_ids, e, bm, sorted_ids, expert_ids, num_post) -> None:
    """The alignment matches its definition (module docstring of moe_align)."""
    flat = topk_ids.reshape(-1).cpu()
    n = flat.numel()
    sorted_ids, expert_ids = sorted_ids.cpu(), expert_ids.cpu()
    total = int(num_post)
    assert total % bm == 0 and sorted_ids.numel() == expert_ids.numel() * bm
    assert expert_ids.numel() == max_num_blocks(n, e, bm) >= total // bm
    pos = 0
    for ex in range(e):
        mine = torch.nonzero(flat == ex).flatten()
        seg = -(-mine.numel() // bm) * bm
        assert torch.equal(sorted_ids[pos : pos + mine.numel()].long(), mine)  # ascending
        assert (sorted_ids[pos + mine.numel() : pos + seg] == n).all()  # padding sentinel
        assert (expert_ids[pos // bm : (pos + seg) // bm] == ex).all()
        pos += seg
    assert pos == total
    assert (sorted_ids[total:] == n).all() and (expert_ids[total // bm :] == -1).all()


def assert_same(a, b) -> None:
    for x, y, name in zip(a, b, ("sorted_token_ids", "expert_ids", "num_tokens_post_padded")):
        assert torch.equal(x.cpu(), y.cpu()), (name, x, y)


@settings(max_examples=15, deadline=None)
@given(t=st.integers(1, 64), k=st.integers(1, 4), e=st.integers(1, 16),
       bm=st.sampled_from([16, 32, 64]), chunk=st.sampled_from([None, None, 16, 64]),
       skew=st.booleans(), int64=st.booleans(), seed=st.integers(0, 2**16))
def test_moe_align_matches_reference(t, k, e, bm, chunk, skew, int64, seed):
    k = min(k, e)
    ids = routing(t, k, e, seed, skew).to(torch.int64 if int64 else torch.int32).to(DEVICE)
    out = moe_align(ids, e, bm, chunk=chunk)
    ref = moe_align_ref(ids, e, bm)
    assert_same(out, ref)
    check_definition(ids, e, bm, *ref)


def test_reference_matches_definition_on_skewed_routings():
    for seed, (t, k, e, bm) in enumerate([(1, 1, 1, 16), (7, 3, 16, 16), (50, 2, 3, 64), (20, 4, 4, 32)]):
        ids = routing(t, k, e, seed, skew=True)
        check_definition(ids, e, bm, *moe_align_ref(ids, e, bm))


def test_all_pairs_on_one_expert_and_many_chunks():
    ids = torch.full((40, 1), 3, dtype=torch.int32)  # one expert, 40 pairs -> 3 blocks of 16
    for chunk in (None, 8, 64):
        out = moe_align(ids, 5, 16, chunk=chunk)
        assert_same(out, moe_align_ref(ids, 5, 16))
        assert int(out[2]) == 48 and out[1][:3].tolist() == [3, 3, 3]


def test_non_contiguous_ids_and_empty():
    ids = routing(12, 3, 6, 0).t().contiguous().t()  # [12, 3] view with strides (1, 12)
    assert not ids.is_contiguous()
    assert_same(moe_align(ids, 6, 16), moe_align_ref(ids, 6, 16))
    sorted_ids, expert_ids, num_post = moe_align(torch.zeros(0, 2, dtype=torch.int32), 4, 16)
    assert int(num_post) == 0 and sorted_ids.numel() == expert_ids.numel() == 0


def test_bad_inputs():
    ids = torch.zeros(4, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="topk_ids must be \\[T, k\\]"):
        moe_align(ids.flatten(), 4, 16)
    with pytest.raises(ValueError, match="int32 or int64"):
        moe_align(ids.float(), 4, 16)
    with pytest.raises(ValueError, match="block_m"):
        moe_align(ids, 4, 24)
    with pytest.raises(ValueError, match="num_experts"):
        moe_align(ids, 0, 16)
    with pytest.raises(ValueError, match="chunk"):
        moe_align(ids, 4, 16, chunk=12)


@pytest.mark.gpu
@pytest.mark.parametrize("t,k,e,bm", [(256, 8, 128, 16), (16384, 8, 128, 64), (3000, 6, 64, 32)])
def test_moe_align_cuda(t, k, e, bm):
    """Both paths (single program for <= 4096 pairs, chunked above) at model shapes."""
    ids = torch.randn(t, e, device="cuda").topk(k, dim=-1).indices.int()
    out = moe_align(ids, e, bm)
    assert_same(out, moe_align_ref(ids, e, bm))
