"""executor=ray at tensor_parallel_size=2 on a local Ray cluster started for this module (two
logical CPUs, no dashboard): greedy parity with transformers for tiny_llama (and tiny_deepseek
with -m slow) over the parity prompts that share a prefix (chunked prefill, prefix hits,
preemption in one run), and an actor killed
mid-run -> RankFailedError naming its rank. The engines are kept for the module; the kill test
reuses tiny_llama's."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from tests.engine.parity_utils import hf_greedy_outputs  # noqa: E402
from tests.executor.tp_utils import (  # noqa: E402
    TP2,
    assert_parity,
    kill_rank_1_mid_decode,
    lazy_engines,
    parity_run,
)

pytestmark = pytest.mark.ray
# 4 logical CPUs: the module keeps two engines of two 1-CPU actors each
RAY = TP2 | {"executor": "ray", "executor.num_cpus": 4}


@pytest.fixture(scope="module")
def engines():
    """get(model) -> the module's TP=2 ray LLM of that model; Ray is shut down at the end."""
    with lazy_engines(**RAY) as get:
        yield get
    ray.shutdown()


# tiny_deepseek (MLA, MoE split over the ranks) under TP=2 is the default suite's with
# executor=multiproc (test_multiproc.py); through Ray actors with -m slow
@pytest.mark.parametrize("model", ["tiny_llama",
                                   pytest.param("tiny_deepseek", marks=pytest.mark.slow)])
def test_ray_tp2_greedy_equals_transformers(engines, model):
    """The prompts with a shared prefix (the longer ones chunked, prefix hits, preemption:
    assert_parity checks each); executor=multiproc runs both prompt sets."""
    assert_parity(parity_run(engines(model), ("prefix",)), hf_greedy_outputs(model))


def test_killed_actor_is_named(engines):
    kill_rank_1_mid_decode(engines("tiny_llama"), r"rank 1 \(its Ray actor\) died", within_s=10)
