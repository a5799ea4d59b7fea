"""Property test: whatever temperature / top-k / top-p / min-p, no masked token is ever drawn.

A float64 reference computes each row's kept set stage by stage; examples with a token within a
hair of a min-p or top-p boundary are discarded (float32 vs float64 could legitimately differ).
"""

import numpy as np
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from lab.core.sampling_params import SamplingParams
from lab.sampling import Sampler, SamplingMetadata

V = 32
REPEATS = 16
_MARGIN = 1e-4

row_params = st.builds(
    SamplingParams,
    temperature=st.one_of(st.just(0.0), st.floats(0.05, 2.0)),
    top_k=st.one_of(st.sampled_from([-1, 0, 1]), st.integers(1, V + 8)),
    top_p=st.one_of(st.just(1.0), st.floats(0.01, 1.0)),
    min_p=st.one_of(st.just(0.0), st.floats(0.01, 0.95)),
)


def _reference_kept(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """Boolean [V] of tokens the row may produce; discards near-boundary examples."""
    if p.is_greedy:
        return np.arange(V) == int(np.argmax(logits))
    lg = logits.astype(np.float64) / p.temperature
    probs = np.exp(lg - lg.max())
    probs /= probs.sum()
    kept = np.ones(V, dtype=bool)
    if p.min_p > 0:
        ratio = probs / probs.max()
        assume(np.all(np.abs(ratio - p.min_p) > _MARGIN))
        kept &= ratio >= p.min_p
    if p.top_k > 0:
        rank = np.array([(lg > x).sum() for x in lg])  # tokens strictly above each one
        kept &= rank < p.top_k
    if p.top_p < 1:
        q = np.where(kept, probs, 0.0)
        q /= q.sum()
        above = np.array([q[lg > x].sum() for x in lg])
        assume(np.all(np.abs(above[kept] - p.top_p) > _MARGIN))
        kept &= above < p.top_p
    return kept


@given(
    rows=st.lists(row_params, min_size=1, max_size=5),
    scale=st.floats(0.3, 6.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_masked_tokens_never_sampled(rows: list[SamplingParams], scale: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(rows), V, generator=gen) * scale
    kept = np.stack([_reference_kept(logits[i].numpy(), p) for i, p in enumerate(rows)])

    meta = SamplingMetadata.from_params(rows, None, "cpu")
    random_rows = ~meta.is_greedy.numpy()
    finite = torch.isfinite(Sampler().process_logits(logits, meta)).numpy()
    assert np.array_equal(finite[random_rows], kept[random_rows])

    torch.manual_seed(seed)
    batch = logits.repeat(REPEATS, 1)
    big = SamplingMetadata.from_params(rows * REPEATS, None, "cpu")
    tokens = Sampler()(batch, big).view(REPEATS, len(rows)).numpy()
    for i in range(len(rows)):
        assert kept[i, tokens[:, i]].all(), (rows[i], tokens[:, i], np.flatnonzero(kept[i]))
