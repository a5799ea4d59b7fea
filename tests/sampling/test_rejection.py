"""Rejection sampling's guarantee (lab/sampling/rejection.py): the emitted tokens follow the
target's distribution whatever the draft proposes. N requests with the same target rows in one
call of the reference (the kernel emits the same tokens: tests/kernels/test_kernel_rejection.py);
a chi-square goodness-of-fit test of the first token against p_0 and, where the first token was
the accepted draft, of the second against p_1. Seeds are fixed: the test is deterministic. Also
`draw_noise`'s seeded rows."""

from __future__ import annotations

import pytest
import torch

from lab.kernels.rejection import PLACEHOLDER, rejection_sample_ref
from lab.sampling.rejection import draw_noise

N = 10000
# chi2.isf(1e-4, df) (scipy): a sampler that is right fails once in 10^4 seeds
CRITICAL = {1: 15.137, 2: 18.421, 3: 21.108, 4: 23.513, 5: 25.745, 6: 27.856, 7: 29.878}

P0 = torch.tensor([0.30, 0.05, 0.20, 0.10, 0.15, 0.02, 0.08, 0.10])
P1 = torch.tensor([0.02, 0.40, 0.08, 0.10, 0.05, 0.15, 0.12, 0.08])
Q0 = torch.tensor([0.05, 0.30, 0.05, 0.25, 0.05, 0.20, 0.05, 0.05])  # the draft disagrees
Q1 = torch.tensor([0.20, 0.10, 0.10, 0.10, 0.20, 0.10, 0.10, 0.10])


def _top_p(p: torch.Tensor, top_p: float, temperature: float) -> torch.Tensor:
    """p after temperature then top-p (what the target's sampling parameters make of it): the
    tail outside the nucleus is exactly 0."""
    p = torch.softmax(p.log() / temperature, -1)
    order = p.argsort(descending=True)
    keep = (p[order].cumsum(0) - p[order]) < top_p
    out = torch.zeros_like(p)
    out[order[keep]] = p[order[keep]]
    return out / out.sum()


def _sample(p: list[torch.Tensor], q: list[torch.Tensor] | None, drafts: list[int] | None,
            seed: int) -> torch.Tensor:
    """N requests of k = len(q or drafts) drafts (each drawn from its q, or fixed: point
    masses) against target rows p[0..k]; the reference's [N, k + 1] tokens."""
    torch.manual_seed(seed)
    k = len(p) - 1
    if q is not None:
        draft_ids = torch.stack([torch.multinomial(qj, N, replacement=True) for qj in q], 1)
        draft_probs = torch.stack(q).repeat(N, 1)
    else:
        draft_ids, draft_probs = torch.tensor(drafts).repeat(N, 1), None
    target = torch.stack(p).repeat(N, 1)  # request i's rows i*(k+1) .. i*(k+1)+k
    noise = draw_noise([k] * N, len(P0), [None] * N)
    return rejection_sample_ref(draft_ids.flatten(), [k] * N, target, draft_probs,
                                torch.zeros(N, dtype=torch.bool), noise)


def _assert_follows(tokens: torch.Tensor, p: torch.Tensor) -> None:
    """Chi-square goodness of fit over p's support; no token outside it at all."""
    counts = torch.bincount(tokens, minlength=len(p)).double()
    support = p > 0
    assert counts[~support].sum() == 0, counts
    expected = len(tokens) * p[support].double()
    stat = float(((counts[support] - expected) ** 2 / expected).sum())
    assert stat < CRITICAL[int(support.sum()) - 1], (stat, (counts / len(tokens)).tolist())


def _assert_second_follows(out: torch.Tensor, p1: torch.Tensor) -> None:
    """Where the first draft was accepted (a second token was emitted) the second token
    follows p_1: its step is a fresh one."""
    accepted = out[:, 1] != PLACEHOLDER
    assert accepted.sum() > N // 10  # enough draws to test
    _assert_follows(out[accepted, 1], p1)


@pytest.mark.parametrize("p0", [P0, _top_p(P0, 0.7, 0.8)], ids=["plain", "top_p"])
def test_first_token_follows_the_target_with_a_draft_model(p0):
    out = _sample([p0, P1], [Q0], None, seed=0)
    _assert_follows(out[:, 0], p0)


@pytest.mark.parametrize("draft", [0, 5])  # a likely token; one top-p removes
@pytest.mark.parametrize("p0", [P0, _top_p(P0, 0.7, 0.8)], ids=["plain", "top_p"])
def test_first_token_follows_the_target_with_point_masses(p0, draft):
    out = _sample([p0, P1], None, [draft], seed=1)
    _assert_follows(out[:, 0], p0)


@pytest.mark.parametrize("top_p", [False, True])
def test_two_drafts_each_token_follows_its_target_row(top_p):
    """k = 2: the first token against p_0; after an accepted first draft, the second against
    p_1."""
    p0, p1 = (_top_p(P0, 0.7, 0.8), _top_p(P1, 0.6, 1.2)) if top_p else (P0, P1)
    out = _sample([p0, p1, P0], [Q0, Q1], None, seed=2)
    _assert_follows(out[:, 0], p0)
    _assert_second_follows(out, p1)


def test_two_point_mass_drafts_the_second_token_follows_p1():
    out = _sample([P0, P1, P0], None, [2, 1], seed=3)
    _assert_follows(out[:, 0], P0)
    _assert_second_follows(out, P1)


def test_the_sampler_notices_a_wrong_distribution():
    """The check has power: tokens from q instead of p fail it."""
    torch.manual_seed(4)
    with pytest.raises(AssertionError):
        _assert_follows(torch.multinomial(Q0, N, replacement=True), P0)


def test_output_is_padded_after_the_emitted_tokens():
    out = _sample([P0, P1, P0], [Q0, Q1], None, seed=5)
    emitted = (out != PLACEHOLDER).sum(1)
    assert emitted.min() >= 1 and emitted.max() == 3
    assert torch.equal(out != PLACEHOLDER, torch.arange(3) < emitted[:, None])


def test_seeded_rows_draw_the_same_noise_whatever_the_rest_of_the_batch():
    """A seeded request's uniforms and race come from its generator alone: the same with other
    unseeded (or no) requests beside it, whatever the global RNG's state."""
    def gen(seed):
        return torch.Generator().manual_seed(seed)

    torch.manual_seed(10)
    a = draw_noise([2, 1, 3], 16, [gen(7), None, gen(8)])
    torch.manual_seed(11)
    b = draw_noise([4, 2, 0, 3], 16, [None, gen(7), None, gen(8)])
    c = draw_noise([2, 3], 16, [gen(7), gen(8)])
    for noise, first, second in ((a, (0, 0), (2, 3)), (b, (1, 4), (3, 6)), (c, (0, 0), (1, 2))):
        assert torch.equal(noise.uniform[first[1] : first[1] + 2], c.uniform[:2])
        assert torch.equal(noise.uniform[second[1] : second[1] + 3], c.uniform[2:])
        assert torch.equal(noise.exponential[first[0]], c.exponential[0])
        assert torch.equal(noise.exponential[second[0]], c.exponential[1])
    assert not torch.equal(a.exponential[1], b.exponential[0])  # unseeded: the global RNG
    assert bool((a.exponential > 0).all())
