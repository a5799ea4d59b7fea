"""Under the simulator, every scheduler x preemption pair finishes every request of a
hypothesis-drawn workload (arrivals, lengths, priorities, shared prefixes) with its full output and
leaks no block, on a cache small enough to preempt."""

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.config.compose import compose_config
from lab.core.sampling_params import SamplingParams
from lab.engine.llm_engine import LLMEngine
from lab.engine.replay import replay
from lab.workloads.base import WorkloadRequest
from tests.options import options

BLOCK, BLOCKS, MAX_LEN = 4, 24, 64  # 23 usable blocks of 4 tokens: a few requests at a time


@cache
def engine(scheduler: str, preemption: str) -> LLMEngine:
    """One engine per pair, reused across examples (each example must leave it clean)."""
    return LLMEngine(compose_config([
        "executor=sim", "sim/step_time=constant", "logger=[]", f"scheduler={scheduler}",
        f"preemption={preemption}", f"num_gpu_blocks={BLOCKS}", f"block_size={BLOCK}",
        f"max_model_len={MAX_LEN}", "max_num_batched_tokens=32", "cache.swap_space_gb=0.0001"]))


@st.composite
def workloads(draw) -> list[WorkloadRequest]:
    n = draw(st.integers(1, 10))
    prefix = draw(st.lists(st.integers(3, 500), min_size=0, max_size=8))
    reqs, t = [], 0.0
    for i in range(n):
        own = draw(st.lists(st.integers(3, 500), min_size=1, max_size=30))
        prompt = (prefix if draw(st.booleans()) else []) + own
        out = draw(st.integers(1, MAX_LEN - len(prompt)))
        t += draw(st.sampled_from([0.0, 0.0, 0.005, 0.03]))
        reqs.append(WorkloadRequest(prompt, SamplingParams(max_tokens=out, ignore_eos=True),
                                    arrival_time=t, priority=draw(st.integers(0, 2)),
                                    client_id=f"c{i % 2}", request_id=f"r{i}"))
    return reqs


@pytest.mark.parametrize("preemption", options("preemption"))
@pytest.mark.parametrize("scheduler", options("scheduler"))
@settings(max_examples=8)
@given(requests=workloads())
def test_every_pair_finishes_every_request_without_leaking_blocks(scheduler, preemption,
                                                                  requests):
    eng = engine(scheduler, preemption)
    summary = replay(eng, requests)
    assert summary.num_rejected == 0
    assert summary.num_finished == {"length": len(requests)}
    assert summary.total_output_tokens == sum(r.sampling_params.max_tokens for r in requests)
    kv = eng.scheduler.kv
    assert kv.num_used_blocks == 0 and kv.num_free_blocks == kv.num_blocks - 1
    if kv.swap_space is not None:
        assert kv.swap_space.num_used_blocks == 0
    assert not eng.has_unfinished_requests()
