"""The C++ row argmax (lab/kernels/cpu_argmax.cpp) equals its reference, x.max(dim=-1).indices:
the first index on ties, a NaN counting as the largest (its first one), every row length
(vector body and scalar tail), strided rows; kernels=cpu's argmax (the sampler's greedy pick)
goes through it for fp32 CPU logits, the reference for anything else."""

import pytest
import torch

from lab.core.sampling_params import SamplingParams
from lab.kernels import cpu_argmax
from lab.layers.cpu_ops import CPUOps
from lab.sampling.metadata import SamplingMetadata
from lab.sampling.sampler import Sampler

pytestmark = pytest.mark.skipif(not cpu_argmax.available(),
                                reason="the CPU argmax kernel could not be built here")


@pytest.mark.parametrize("v", [1, 7, 16, 17, 31, 32, 33, 100, 16384])
def test_equals_reference_on_every_row_length(v):
    x = torch.randn(5, v, generator=torch.Generator().manual_seed(v))
    assert torch.equal(cpu_argmax.argmax_rows(x), cpu_argmax.argmax_rows_ref(x))


def test_ties_take_the_first_index_and_nan_wins():
    x = torch.zeros(6, 40)
    x[0, [3, 19, 35]] = 5.0  # ties across lanes and the tail
    x[1, [20, 4]] = 2.0  # the later lane holds the earlier index
    x[2, 37] = float("nan")  # a NaN in the tail
    x[3, [9, 25]] = float("nan")  # NaNs in the body: the first
    x[4] = -float("inf")  # all -inf: index 0
    x[5, 39] = float("inf")
    x[5, 2] = float("nan")
    assert torch.equal(cpu_argmax.argmax_rows(x), cpu_argmax.argmax_rows_ref(x))
    assert cpu_argmax.argmax_rows(x).tolist() == [3, 4, 37, 9, 0, 2]


def test_strided_rows_and_refusals():
    base = torch.randn(4, 80)
    x = base[:, 5:70]
    assert torch.equal(cpu_argmax.argmax_rows(x), cpu_argmax.argmax_rows_ref(x))
    assert not cpu_argmax.supports(base.t()) and not cpu_argmax.supports(base.double())
    with pytest.raises(RuntimeError, match="2-D fp32 CPU tensor with contiguous rows"):
        cpu_argmax.argmax_rows(base.t())


def test_the_cpu_options_argmax_uses_it(monkeypatch):
    calls = []
    real = cpu_argmax.argmax_rows
    monkeypatch.setattr(cpu_argmax, "argmax_rows", lambda x: calls.append(1) or real(x))
    ops = CPUOps(argmax=cpu_argmax.CPUArgmax())
    ops.setup(torch.device("cpu"), torch.float32)
    x = torch.randn(3, 50)
    assert torch.equal(ops.argmax_rows(x), x.argmax(-1)) and calls
    assert torch.equal(ops.argmax_rows(x.double()), x.double().argmax(-1)) and len(calls) == 1
    greedy = SamplingMetadata.from_params([SamplingParams(temperature=0.0)] * 3, None, "cpu")
    assert torch.equal(Sampler(argmax=ops.argmax_rows)(x, greedy), x.argmax(-1))
    assert len(calls) == 2
