"""The defaults show the design card's point on a CPU: the default workload has priority classes,
`python run.py`'s KV cache (one request of the model's context: lab.run.demonstration_cache) is
smaller than that workload wants (so its runs preempt) while every request still fits, no SLO is
set by default, and runs through Triton's interpreter replay fewer requests."""

import math

import pytest
import torch
from hydra.utils import instantiate

from lab.config.compose import compose_config
from lab.engine.llm_engine import LLMEngine
from lab.run import demonstration_cache
from lab.workloads.synthetic import (
    DEFAULT_NUM_REQUESTS,
    INTERPRETER_NUM_REQUESTS,
    SyntheticWorkload,
)

DESIGN_CARD = ["attention=triton_mla", "scheduler=priority", "preemption=swap", "quant=fp8"]


@pytest.mark.parametrize(("overrides", "interpreted"), [([], False), (DESIGN_CARD, True)],
                         ids=["default", "design-card"])
def test_run_py_kv_cache_is_smaller_than_the_default_workload_wants(overrides, interpreted):
    """Every request arrives at once and they want 1.3x more blocks than run.py's cache has, so
    the run must preempt; and the longest request still fits (none is rejected)."""
    cfg = compose_config([*overrides, "logger=[]", "device=cpu"])
    demonstration_cache(cfg)
    engine = LLMEngine(cfg)
    bs = cfg.block_size
    reqs = instantiate(cfg.workload).requests(engine.hf_config.vocab_size, engine.eos_token_id,
                                              interpreted=interpreted)
    assert all(r.arrival_time == 0 for r in reqs)
    lengths = [len(r.prompt_token_ids) + r.sampling_params.max_tokens for r in reqs]
    wanted = sum(math.ceil(n / bs) for n in lengths)
    usable = engine.num_blocks - 1
    assert wanted > 1.3 * usable, (wanted, usable)
    assert max(lengths) <= engine.max_model_len
    context = engine.hf_config.max_position_embeddings
    assert usable == math.ceil(context / bs) and engine.max_model_len == context  # room for one


def test_default_workload_has_priority_classes_and_no_slo():
    cfg = compose_config()
    reqs = instantiate(cfg.workload).requests(512, 2)
    assert len(reqs) == DEFAULT_NUM_REQUESTS
    assert {r.priority for r in reqs} == {0, 1, 2}
    assert dict(cfg.slo) == {"ttft_s": None, "tpot_s": None, "e2e_s": None}


def test_interpreter_runs_replay_fewer_requests_unless_told_how_many():
    default = SyntheticWorkload(num_requests=None)
    assert len(default.requests(512, 2, interpreted=True)) == INTERPRETER_NUM_REQUESTS
    assert len(default.requests(512, 2)) == DEFAULT_NUM_REQUESTS > INTERPRETER_NUM_REQUESTS
    assert len(SyntheticWorkload(num_requests=40).requests(512, 2, interpreted=True)) == 40


def test_the_default_run_preempts_and_priority_serves_priority_0_first():
    """The default run, replayed for real (attention=torch): it preempts, and under
    scheduler=priority the median TTFT grows with the priority value."""
    from lab.engine.replay import replay

    ttft = {}
    for scheduler in ("fcfs", "priority"):
        cfg = compose_config([f"scheduler={scheduler}", "logger=[]", "device=cpu"])
        demonstration_cache(cfg)
        engine = LLMEngine(cfg)
        summary = replay(engine, instantiate(cfg.workload).requests(
            engine.hf_config.vocab_size, engine.eos_token_id))
        assert summary.num_preemptions > 0 and summary.num_requests == DEFAULT_NUM_REQUESTS
        ttft[scheduler] = [summary.ttft_by_priority[p]["p50"] for p in ("0", "1", "2")]
    assert ttft["priority"] == sorted(ttft["priority"]) and ttft["priority"][0] < ttft["fcfs"][0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs only without CUDA")
@pytest.mark.parametrize(("overrides", "interpreted"), [
    ([], False), (["kernels=triton"], True), (["attention=triton_flash"], True),
])
def test_only_runs_that_launch_triton_kernels_count_as_interpreted(overrides, interpreted):
    """The PyTorch references live beside the kernels (lab/kernels), so importing them must not
    make a torch-only run count as interpreted (it replayed half the default workload)."""
    engine = LLMEngine(compose_config(overrides + ["num_gpu_blocks=16"]))
    assert engine.triton_interpreted is interpreted
