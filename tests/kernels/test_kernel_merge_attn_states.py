"""merge_attn_states (Triton, interpreted on CPU) vs its PyTorch reference and vs full attention."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lab.kernels  # noqa: F401  (switches Triton to its interpreter when there is no CUDA)
from lab.kernels.merge_attn_states import merge_attn_states, merge_attn_states_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _partials(b, h, s, d, empty_prob, seed):
    """Random partial outputs/LSEs; empty splits get lse = -inf and NaN outputs (must be unread)."""
    g = torch.Generator().manual_seed(seed)
    p_out = torch.randn(b, h, s, d, generator=g)
    p_lse = torch.randn(b, h, s, generator=g) * 4
    empty = torch.rand(b, h, s, generator=g) < empty_prob
    if b * h > 1:
        empty[0, 0] = True  # always one row with every split empty
    p_lse[empty] = float("-inf")
    p_out[empty] = float("nan")
    return p_out.to(DEVICE), p_lse.to(DEVICE)


def _run_both(p_out, p_lse, out_dtype, with_lse):
    b, h, _, d = p_out.shape
    out = torch.empty(b, h, d, dtype=out_dtype, device=DEVICE)
    lse = torch.empty(b, h, device=DEVICE) if with_lse else None
    merge_attn_states(p_out, p_lse, out, lse)
    ref_out = torch.empty_like(out)
    ref_lse = merge_attn_states_ref(p_out, p_lse, ref_out)
    return out, lse, ref_out, ref_lse


@settings(max_examples=15, deadline=None)
@given(
    b=st.integers(1, 3),
    h=st.integers(1, 4),
    s=st.integers(1, 16),
    d=st.sampled_from([16, 32, 48, 64, 128]),
    empty_prob=st.sampled_from([0.0, 0.3, 0.7]),
    out_dtype=st.sampled_from([torch.float32, torch.float16]),
    with_lse=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_merge_matches_reference(b, h, s, d, empty_prob, out_dtype, with_lse, seed):
    p_out, p_lse = _partials(b, h, s, d, empty_prob, seed)
    out, lse, ref_out, ref_lse = _run_both(p_out, p_lse, out_dtype, with_lse)
    tol = 1e-5 if out_dtype == torch.float32 else 2e-3
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref_out, atol=tol, rtol=tol)
    if with_lse:
        torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


def test_all_splits_empty_gives_zeros_and_neg_inf():
    p_out = torch.full((2, 3, 4, 32), float("nan"), device=DEVICE)
    p_lse = torch.full((2, 3, 4), float("-inf"), device=DEVICE)
    out = torch.full((2, 3, 32), 7.0, device=DEVICE)
    lse = torch.zeros(2, 3, device=DEVICE)
    merge_attn_states(p_out, p_lse, out, lse)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.isneginf(lse).all()


@pytest.mark.parametrize("num_chunks", [1, 3, 5])
def test_merging_chunks_equals_full_attention(num_chunks):
    """Attention over disjoint key chunks, merged by LSE, equals attention over all keys."""
    g = torch.Generator().manual_seed(num_chunks)
    b, h, n, d = 2, 3, 37, 16
    q, k, v = (torch.randn(b, h, x, d, generator=g, dtype=torch.float64) for x in (1, n, n))
    scores = (q @ k.transpose(-1, -2)).squeeze(2) * d**-0.5  # [B, H, N]
    full = (torch.softmax(scores, -1)[:, :, None] @ v).squeeze(2)
    bounds = torch.linspace(0, n, num_chunks + 1).long().tolist()
    p_out = torch.stack([
        (torch.softmax(scores[..., lo:hi], -1)[:, :, None] @ v[:, :, lo:hi]).squeeze(2)
        for lo, hi in zip(bounds[:-1], bounds[1:])
    ], dim=2)
    p_lse = torch.stack([scores[..., lo:hi].logsumexp(-1) for lo, hi in zip(bounds[:-1], bounds[1:])], 2)
    out = torch.empty(b, h, d, device=DEVICE)
    lse = torch.empty(b, h, device=DEVICE)
    merge_attn_states(p_out.float().to(DEVICE), p_lse.float().to(DEVICE), out, lse)
    torch.testing.assert_close(out.cpu().double(), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.cpu().double(), scores.logsumexp(-1), atol=1e-5, rtol=1e-5)


def test_strided_views():
    """Views into larger buffers (as DecodeWorkspace hands out) are read through their strides."""
    big_out, big_lse = _partials(4, 5, 8, 64, 0.3, seed=3)
    p_out, p_lse = big_out[:2, :3, :5, :32], big_lse[:2, :3, :5]
    out_big = torch.zeros(2, 6, 32, device=DEVICE)
    out = out_big[:, ::2]  # non-contiguous head stride
    merge_attn_states(p_out, p_lse, out)
    ref = torch.empty(2, 3, 32, device=DEVICE)
    merge_attn_states_ref(p_out, p_lse, ref)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(out_big[:, 1::2], torch.zeros_like(out_big[:, 1::2]))
