"""SamplingMetadata.from_params: tensors, flags and generators."""

import pytest
import torch

from lab.core.sampling_params import SamplingParams
from lab.sampling import SamplingMetadata, make_generator


def test_all_greedy_flags() -> None:
    meta = SamplingMetadata.from_params([SamplingParams(temperature=0.0)] * 3, [None] * 3, "cpu")
    assert meta.all_greedy and not meta.all_random
    assert meta.no_top_k and meta.no_top_p and meta.no_min_p
    assert torch.equal(meta.temperature, torch.ones(3))  # greedy rows never divide by zero
    assert meta.is_greedy.all()


def test_mixed_batch_tensors() -> None:
    params = [
        SamplingParams(temperature=0.0, seed=3),
        SamplingParams(temperature=0.7, top_k=-1, top_p=0.9),
        SamplingParams(temperature=1.3, top_k=5, min_p=0.1, seed=1),
    ]
    gens = [make_generator(3), None, make_generator(1)]
    meta = SamplingMetadata.from_params(params, gens, torch.device("cpu"))
    assert not meta.all_greedy and not meta.all_random
    assert not meta.no_top_k and not meta.no_top_p and not meta.no_min_p
    assert meta.top_k.tolist() == [0, 0, 5]  # -1 and 0 both mean off
    assert meta.top_k.dtype == torch.int64 and meta.temperature.dtype == torch.float32
    assert torch.allclose(meta.temperature, torch.tensor([1.0, 0.7, 1.3]))
    assert torch.allclose(meta.top_p, torch.tensor([1.0, 0.9, 1.0]))
    assert torch.allclose(meta.min_p, torch.tensor([0.0, 0.0, 0.1]))
    assert meta.is_greedy.tolist() == [True, False, False]
    # A greedy row never draws noise, so its generator is dropped.
    assert meta.generators[0] is None and meta.generators[1] is None
    assert meta.generators[2] is gens[2]
    assert meta.seeded_rows == [(2, gens[2])] and meta.batch_size == 3


def test_top_k_beyond_int64_is_clamped() -> None:
    """Any top_k >= 1 is valid (apply_top_k clamps it to the vocabulary); 2**63 did not fit the
    int64 tensor (ValueError in the step: a server's 500)."""
    meta = SamplingMetadata.from_params([SamplingParams(top_k=2**63), SamplingParams(top_k=10**30),
                                         SamplingParams(top_k=7)])
    assert meta.top_k.tolist() == [2**63 - 1, 2**63 - 1, 7]


def test_all_random_and_default_generators() -> None:
    meta = SamplingMetadata.from_params([SamplingParams(), SamplingParams(top_k=4)], None)
    assert meta.all_random and not meta.all_greedy and not meta.no_top_k
    assert meta.generators == [None, None]


def test_generator_count_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="generators"):
        SamplingMetadata.from_params([SamplingParams()], [None, None], "cpu")


def test_make_generator_is_reproducible() -> None:
    a = torch.empty(8).exponential_(generator=make_generator(123, "cpu"))
    b = torch.empty(8).exponential_(generator=make_generator(123))
    assert torch.equal(a, b)
