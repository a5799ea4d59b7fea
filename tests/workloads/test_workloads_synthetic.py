"""SyntheticWorkload: determinism, bounds, arrivals, prefix groups, validation, YAML presets."""

from pathlib import Path

import numpy as np
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lab.workloads import SyntheticWorkload, Workload, WorkloadRequest
from lab.workloads.distributions import LengthDist, TokenSampler
from lab.workloads.synthetic import default_num_requests
from tests.options import options

REPO = Path(__file__).resolve().parents[2]
VOCAB, EOS = 1000, 2


def _reqs(**kw) -> list[WorkloadRequest]:
    return SyntheticWorkload(**kw).requests(VOCAB, EOS)


def _key(reqs):
    return [(r.prompt_token_ids, r.sampling_params.max_tokens, r.arrival_time, r.priority)
            for r in reqs]


def test_deterministic_given_seed():
    kw = dict(num_requests=20, arrival="poisson", rate=5.0, num_prefix_groups=3, prefix_len=8,
              num_priorities=3)
    assert _key(_reqs(**kw, seed=1)) == _key(_reqs(**kw, seed=1))
    assert _key(_reqs(**kw, seed=1)) != _key(_reqs(**kw, seed=2))


def test_arrival_process_does_not_change_prompts():
    a = _reqs(num_requests=10, seed=3)
    b = _reqs(num_requests=10, seed=3, arrival="gamma", rate=2.0, burstiness=0.5)
    assert [r.prompt_token_ids for r in a] == [r.prompt_token_ids for r in b]


@pytest.mark.parametrize("dist", ["uniform", "normal", "lognormal"])
def test_lengths_within_bounds(dist):
    reqs = _reqs(num_requests=300, prompt_len={"dist": dist, "min": 5, "max": 40},
                 output_len={"dist": dist, "min": 2, "max": 9})
    plens = [len(r.prompt_token_ids) for r in reqs]
    olens = [r.sampling_params.max_tokens for r in reqs]
    assert min(plens) >= 5 and max(plens) <= 40 and len(set(plens)) > 5
    assert min(olens) >= 2 and max(olens) <= 9


def test_fixed_lengths_and_sampling_defaults():
    reqs = _reqs(num_requests=5, prompt_len=12, output_len={"dist": "fixed", "value": 7})
    assert all(len(r.prompt_token_ids) == 12 for r in reqs)
    sp = reqs[0].sampling_params
    assert sp.max_tokens == 7 and sp.ignore_eos and sp.is_greedy
    assert [r.request_id for r in reqs] == [str(i) for i in range(5)]


def test_token_ids_avoid_special_ids():
    ids = {t for r in _reqs(num_requests=50, prompt_len=100) for t in r.prompt_token_ids}
    assert min(ids) >= 3 and max(ids) < VOCAB and EOS not in ids
    sampler = TokenSampler(vocab_size=6, eos_token_id=4, low=3)
    assert set(sampler.draw(np.random.default_rng(0), 200)) == {3, 5}


def test_batch_arrivals_all_at_zero():
    assert all(r.arrival_time == 0.0 for r in _reqs(num_requests=8))


@pytest.mark.parametrize("arrival,burstiness", [("poisson", 1.0), ("gamma", 0.5), ("gamma", 4.0)])
def test_arrivals_monotone_with_mean_rate(arrival, burstiness):
    reqs = _reqs(num_requests=2000, prompt_len=4, output_len=1, arrival=arrival, rate=10.0,
                 burstiness=burstiness)
    t = np.array([r.arrival_time for r in reqs])
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    assert (len(t) - 1) / t[-1] == pytest.approx(10.0, rel=0.15)


def test_gamma_burstiness_changes_gap_spread():
    def cv(b):
        t = [r.arrival_time for r in _reqs(num_requests=2000, prompt_len=4, output_len=1,
                                           arrival="gamma", rate=10.0, burstiness=b)]
        gaps = np.diff(t)
        return gaps.std() / gaps.mean()
    assert cv(0.25) > 1.5 > 0.7 > cv(4.0)  # cv = 1/sqrt(shape)


def test_prefix_groups_share_exactly_prefix_len():
    reqs = _reqs(num_requests=40, num_prefix_groups=4, prefix_len=10,
                 prompt_len={"min": 11, "max": 30})
    by_id = {int(r.request_id): r.prompt_token_ids for r in reqs}
    for i in range(40):
        for j in range(i + 1, 40):
            shared = _common_prefix(by_id[i], by_id[j])
            assert shared == (10 if i % 4 == j % 4 else 0), (i, j)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_priorities_and_clients():
    reqs = _reqs(num_requests=60, num_priorities=3, num_clients=2)
    assert {r.priority for r in reqs} == {0, 1, 2}
    assert {r.client_id for r in reqs} == {"client0", "client1"}


@pytest.mark.parametrize("kwargs,field", [
    (dict(num_requests=0), "num_requests"),
    (dict(prompt_len={"min": 0, "max": 4}), "prompt_len.min"),
    (dict(prompt_len={"min": 8, "max": 4}), "prompt_len.max"),
    (dict(output_len={"dist": "zipf", "min": 1, "max": 4}), "output_len.dist"),
    (dict(output_len={"min": 1, "max": 4, "mu": 3}), "output_len.mu"),
    (dict(output_len={"dist": "normal", "min": 1, "max": 4, "std": -1}), "output_len.std"),
    (dict(output_len="long"), "output_len"),
    (dict(arrival="uniform"), "arrival"),
    (dict(arrival="poisson"), "rate"),
    (dict(arrival="batch", rate=4.0), "rate=4.0 has no effect with arrival=batch"),
    (dict(arrival="gamma", rate=1.0, burstiness=0), "burstiness"),
    (dict(num_prefix_groups=-1), "num_prefix_groups"),
    (dict(num_prefix_groups=2, prefix_len=0), "prefix_len"),
    (dict(num_prefix_groups=2, prefix_len=16, prompt_len={"min": 16, "max": 20}), "prefix_len"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(seed=1.5), "seed"),
])
def test_bad_input_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        SyntheticWorkload(**kwargs)


def test_bad_vocab_names_the_field():
    with pytest.raises(ValueError, match="vocab_size"):
        SyntheticWorkload().requests(vocab_size=3, eos_token_id=None)


def test_length_dist_accepts_dictconfig():
    d = LengthDist.parse(OmegaConf.create({"dist": "normal", "min": 4, "max": 8}), "prompt_len")
    assert d.dist == "normal" and (d.min, d.max) == (4, 8)


@pytest.mark.parametrize("name", options("workload"))
def test_yaml_presets_instantiate(name):
    cfg = OmegaConf.load(REPO / "lab" / "conf" / "workload" / f"{name}.yaml")
    workload = instantiate(cfg)
    assert isinstance(workload, Workload)
    reqs = workload.requests(vocab_size=32000, eos_token_id=2)
    if isinstance(workload, SyntheticWorkload):  # a trace's size is its file's (test_trace.py)
        assert len(reqs) == (cfg.num_requests or default_num_requests(interpreted=False))
    assert reqs
    assert [r.arrival_time for r in reqs] == sorted(r.arrival_time for r in reqs)
