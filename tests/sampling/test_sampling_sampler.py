"""Sampler stages: greedy, mixed batches, top-k, top-p, min-p and the exponential race."""

import pytest
import torch

from lab.core.sampling_params import SamplingParams
from lab.sampling import Sampler, SamplingMetadata, make_generator
from lab.sampling.sampler import apply_min_p, apply_top_k, apply_top_p

sampler = Sampler()


def _meta(params: list[SamplingParams], gens=None) -> SamplingMetadata:
    return SamplingMetadata.from_params(params, gens, "cpu")


def _logits(b: int, v: int, seed: int = 0, scale: float = 2.0) -> torch.Tensor:
    return torch.randn(b, v, generator=make_generator(seed)) * scale


def test_all_greedy_is_argmax_and_draws_no_noise() -> None:
    logits = _logits(5, 40)
    state = torch.get_rng_state()
    out = sampler(logits, _meta([SamplingParams(temperature=0.0)] * 5))
    assert torch.equal(out, logits.argmax(dim=-1)) and out.dtype == torch.long
    assert torch.equal(torch.get_rng_state(), state)  # no random draw on the all-greedy path


def test_mixed_greedy_random_batch() -> None:
    torch.manual_seed(0)
    logits = _logits(8, 30, scale=0.5)  # flat enough that random rows often miss the argmax
    params = [SamplingParams(temperature=0.0 if i % 2 == 0 else 1.0) for i in range(8)]
    meta = _meta(params)
    argmax = logits.argmax(dim=-1)
    random_hits_argmax = []
    for _ in range(20):
        out = sampler(logits, meta)
        assert out.shape == (8,) and out.dtype == torch.long
        assert torch.equal(out[0::2], argmax[0::2])
        random_hits_argmax.append(bool(torch.equal(out[1::2], argmax[1::2])))
    assert not all(random_hits_argmax)


def test_top_k_one_equals_greedy() -> None:
    torch.manual_seed(1)
    logits = _logits(6, 50)
    params = [SamplingParams(temperature=t, top_k=1) for t in (0.3, 0.9, 1.5, 2.0, 0.05, 0.1)]
    for _ in range(5):
        assert torch.equal(sampler(logits, _meta(params)), logits.argmax(dim=-1))


def test_top_k_keeps_exactly_the_k_largest() -> None:
    logits = _logits(3, 20, seed=2)
    out = apply_top_k(logits, torch.tensor([3, 0, 25]))
    kept = torch.isfinite(out)
    assert set(kept[0].nonzero().flatten().tolist()) == set(logits[0].topk(3).indices.tolist())
    assert kept[1].all() and kept[2].all()  # 0 is off; k > vocab keeps everything


def test_top_p_keeps_at_least_one_token() -> None:
    logits = _logits(4, 64, seed=3, scale=4.0)
    for p in (1e-9, 1e-3, 0.2, 0.5, 0.99):
        out = apply_top_p(logits, torch.full((4,), p))
        assert (torch.isfinite(out).sum(dim=-1) >= 1).all()
        assert torch.equal(out.argmax(dim=-1), logits.argmax(dim=-1))  # top token always kept


def test_top_p_keeps_smallest_prefix_reaching_p() -> None:
    probs = torch.tensor([[0.05, 0.4, 0.1, 0.3, 0.15]])
    out = apply_top_p(probs.log(), torch.tensor([0.6]))
    assert torch.isfinite(out).tolist() == [[False, True, False, True, False]]  # 0.4 + 0.3 >= 0.6


def test_tiny_top_p_equals_greedy() -> None:
    torch.manual_seed(4)
    logits = _logits(6, 50)
    params = [SamplingParams(temperature=1.0, top_p=1e-6)] * 6
    for _ in range(5):
        assert torch.equal(sampler(logits, _meta(params)), logits.argmax(dim=-1))


def test_min_p_masks_exactly() -> None:
    probs = torch.tensor([[0.5, 0.2, 0.12, 0.09, 0.05, 0.04]])
    out = apply_min_p(probs.log(), torch.tensor([0.3]))  # threshold 0.15
    assert torch.isfinite(out).tolist() == [[True, True, False, False, False, False]]
    assert torch.allclose(out[0, :2], probs.log()[0, :2])  # survivors untouched
    # Through the sampler: only tokens 0 and 1 are ever drawn, and both are.
    torch.manual_seed(5)
    meta = _meta([SamplingParams(min_p=0.3)] * 2000)
    drawn = sampler(probs.log().expand(2000, -1).contiguous(), meta)
    assert set(drawn.tolist()) == {0, 1}


def test_min_p_keeps_tokens_exactly_at_threshold() -> None:
    """Uniform row: every prob equals min_p * max for min_p = 1, and '<' keeps them all."""
    out = apply_min_p(torch.zeros(1, 8), torch.tensor([1.0]))
    assert torch.isfinite(out).all()


def test_top_p_masks_tokens_at_exactly_one_minus_p() -> None:
    """Uniform over 4: ascending cumsum is 0.25, 0.5, ... exactly; '<= 1 - p' masks two at p=0.5."""
    out = apply_top_p(torch.zeros(2, 4), torch.tensor([0.5, 0.75]))
    assert torch.isfinite(out).sum(dim=-1).tolist() == [2, 3]


# chi-square critical value for 5 degrees of freedom at alpha = 1e-4.
_CHI2_CRIT_DF5 = 25.74


def _chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs.double() * tokens.numel()
    return float(((counts - expected) ** 2 / expected).sum())


_RACE_LOGITS = torch.tensor([0.0, 0.5, 1.0, 1.5, -0.5, 0.2])
_RACE_T = 0.8


@pytest.mark.parametrize("seeded", [False, True], ids=["shared-draw", "per-row-generators"])
def test_exponential_race_matches_softmax(seeded: bool) -> None:
    n = 4000
    torch.manual_seed(6)
    logits = _RACE_LOGITS.expand(n, -1).contiguous()
    gens = [make_generator(10_000 + i) for i in range(n)] if seeded else None
    meta = _meta([SamplingParams(temperature=_RACE_T, seed=1 if seeded else None)] * n, gens)
    tokens = sampler(logits, meta)
    target = torch.softmax(_RACE_LOGITS / _RACE_T, dim=-1)
    assert _chi_square(tokens, target) < _CHI2_CRIT_DF5


def test_exponential_race_detects_wrong_distribution() -> None:
    """Sanity check on the test itself: T=1 samples fail against the T=0.8 target."""
    n = 4000
    torch.manual_seed(7)
    tokens = sampler(_RACE_LOGITS.expand(n, -1).contiguous(), _meta([SamplingParams()] * n))
    target = torch.softmax(_RACE_LOGITS / _RACE_T, dim=-1)
    assert _chi_square(tokens, target) > _CHI2_CRIT_DF5
    assert _chi_square(tokens, torch.softmax(_RACE_LOGITS, dim=-1)) < _CHI2_CRIT_DF5


def test_the_argmax_reference_is_torch_argmax_with_ties_and_nan():
    """The greedy pick's reference (max(dim).indices, faster on the CPU) is torch.argmax's: the
    first index on ties, a NaN row's NaN, -inf rows index 0; on rounded logits full of ties too."""
    row_argmax = sampler.argmax

    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [float("-inf")] * 4,
                      [0.0, float("nan"), 5.0, float("nan")]])
    assert row_argmax(x).tolist() == x.argmax(-1).tolist() == [1, 0, 1]
    many = torch.randn(32, 4096, generator=torch.Generator().manual_seed(0)).round()
    assert torch.equal(row_argmax(many), many.argmax(-1))
