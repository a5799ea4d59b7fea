"""The warm-up before a run's clock starts (lab/engine/warmup.py): it visits each step shape, then
leaves the engine as if fresh — no request, an empty prefix cache, counters and step index from
0, loggers that saw none of it, the global RNG untouched; replay records its seconds, warmup=false
skips it, executor=sim never runs it, LLM(...) only when asked."""

import json
import logging

import pytest
import torch

from lab.config.compose import compose_config
from lab.core.sampling_params import SamplingParams
from lab.engine.llm import LLM
from lab.engine.llm_engine import LLMEngine
from lab.engine.replay import replay
from lab.engine.warmup import PREFIX, warm_up, warmup_phases
from lab.metrics.jsonl import JsonlLogger
from lab.metrics.memory import InMemoryLogger
from lab.workloads.base import WorkloadRequest

BUDGET = 64  # max_num_batched_tokens: the long prefill's chunk
SMALL = ["logger=[]", "device=cpu", "attention=torch", f"max_num_batched_tokens={BUDGET}",
         "num_gpu_blocks=64", "max_num_seqs=16"]


def engine_of(*overrides: str) -> tuple[LLMEngine, InMemoryLogger]:
    logger = InMemoryLogger()
    return LLMEngine(compose_config([*SMALL, *overrides]), loggers=[logger]), logger


def is_warmup(rid: str) -> bool:
    return rid.startswith(PREFIX)


def test_the_warm_up_visits_every_step_shape():
    engine, _ = engine_of()
    warm = warm_up(engine)
    shapes = [(s.num_prefill_reqs, s.num_decode_reqs, s.num_scheduled_tokens) for s in warm.steps]
    assert shapes[0] == (1, 0, BUDGET)  # a full chunk
    assert (1, 0, BUDGET // 8) in shapes  # a short prefill (8 of them fill a step)
    assert (8, 0, BUDGET) in shapes  # 8 prefills
    assert (0, 1, 1) in shapes  # a decode at batch 1
    assert (1, 8, 8 + BUDGET // 8) in shapes  # a mixed step: 8 decodes and a short prefill
    assert (0, 8, 8) in shapes  # a decode at batch 8
    assert all(is_warmup(r) for s in warm.steps for r in s.scheduled_req_ids)
    assert warm.num_steps == 8 and warm.seconds > 0


def test_after_the_warm_up_the_engine_is_as_if_fresh():
    engine, logger = engine_of()
    rng, start = torch.get_rng_state(), engine.clock.now()
    warm = warm_up(engine)
    assert torch.equal(torch.get_rng_state(), rng)  # unseeded samples of the run are unchanged
    assert not engine.has_unfinished_requests()
    status = engine.core_status()
    assert status.num_requests == 0 and status.num_used_blocks == 0
    kv = engine.scheduler.kv
    assert len(kv.block_pool.cached_block_hash_to_block) == 0
    assert kv.prefix_cache_totals.queries == 0 and kv.block_pool.total_evicted == 0
    assert logger.steps == [] and logger.requests == []
    assert not engine.recent_steps and not engine.recent_requests
    assert engine.core.step_count == 0
    assert engine.core.origin >= start + sum(s.execute_time for s in warm.steps)

    # the run's first requests: warm-up prompts again, which hit nothing
    phases = warmup_phases(engine)
    long_prompt, batch_prompt = phases[0][0].prompt_token_ids, phases[2][0].prompt_token_ids
    engine.add_request(long_prompt, SamplingParams(max_tokens=2, temperature=0), "a")
    engine.add_request(batch_prompt, SamplingParams(max_tokens=2, temperature=0), "b")
    while engine.has_unfinished_requests():
        engine.step()
    assert logger.steps[0].step == 0
    assert sum(s.prefix_cache_queries for s in logger.steps) == len(long_prompt) + len(batch_prompt)
    assert sum(s.prefix_cache_hits for s in logger.steps) == 0
    assert [r.num_cached_tokens for r in logger.requests] == [0, 0]
    assert not any(is_warmup(r) for s in logger.steps for r in s.scheduled_req_ids)


def test_replay_warms_up_outside_the_run_and_warmup_false_skips_it(tmp_path):
    requests = [WorkloadRequest(list(range(10, 30)), SamplingParams(max_tokens=3, temperature=0),
                                arrival_time=0.05 * i, request_id=f"r{i}") for i in range(2)]
    engine, logger = engine_of()
    jsonl = JsonlLogger()
    jsonl.on_start(tmp_path)
    engine.loggers.append(jsonl)
    summary = replay(engine, requests)
    jsonl.close(summary)
    assert summary.warmup_steps == 8 and summary.warmup_seconds > 0
    assert summary.num_steps == len(logger.steps) and summary.num_requests == 2
    assert summary.prefix_cache_hits == 16  # r1 on r0's first block: the run's cache works
    assert json.loads((tmp_path / "summary.json").read_text())["warmup_seconds"] > 0
    records = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert records[0]["step"] == 0
    assert not any(is_warmup(r) for rec in records for r in rec["scheduled_req_ids"])
    assert all(not is_warmup(json.loads(line)["request_id"])
               for line in (tmp_path / "requests.jsonl").read_text().splitlines())

    cold, _ = engine_of("warmup=false")
    summary = replay(cold, requests)
    assert summary.warmup_seconds is None and summary.warmup_steps == 0


def test_the_simulator_never_warms_up():
    cfg = compose_config(["logger=[]", "executor=sim", "num_gpu_blocks=64"])
    assert cfg.warmup
    engine = LLMEngine(cfg)
    assert warm_up(engine) is None and engine.clock.now() == 0.0  # the virtual clock kept still
    late = [WorkloadRequest(list(range(10, 30)), SamplingParams(max_tokens=2), arrival_time=1.5)]
    logger = InMemoryLogger()
    engine.loggers.append(logger)
    summary = replay(engine, late)
    assert summary.warmup_seconds is None and summary.warmup_steps == 0
    assert logger.requests[0].arrival_time == 1.5 and logger.steps[0].step == 0


@pytest.mark.parametrize("asked", [False, True])
def test_llm_warms_up_only_when_asked(asked, caplog):
    kwargs = {"warmup": True} if asked else {}
    with caplog.at_level(logging.INFO, logger="lab.engine.warmup"):
        llm = LLM("tiny_llama", attention="torch", device="cpu", num_gpu_blocks=64,
                  max_num_batched_tokens=BUDGET, **kwargs)
    assert llm.cfg.warmup is asked
    assert ("(not part of the run)" in caplog.text) is asked
    assert not llm.engine.recent_steps  # the warm-up's steps are not the caller's


def test_a_core_process_starts_afresh_too():
    """engine_client=async_mp (lab serve's; its client is mp's with an asyncio side): the reset
    runs in the core's process (EngineCore.reset_for_run, a utility over ZMQ), and the
    statistics that come back show it. The warm-up steps the engine synchronously before any
    event loop: AsyncMPClient's own pending receive once hid MPClient._recv, and step() raised
    'NoneType is not callable' here."""
    engine, logger = engine_of("engine_client=async_mp")
    try:
        warm = warm_up(engine)
        assert warm.num_steps >= 6 and logger.steps == [] and not engine.recent_steps
        assert engine.core_status().num_used_blocks == 0
        prompt = warmup_phases(engine)[0][0].prompt_token_ids
        engine.add_request(prompt, SamplingParams(max_tokens=1, temperature=0), "a")
        while engine.has_unfinished_requests():
            engine.step()
        assert logger.steps[0].step == 0 and logger.requests[0].num_cached_tokens == 0
        assert logger.steps[0].prefix_cache_hits == 0
    finally:
        engine.shutdown()


def test_in_tritons_interpreter_the_long_prefill_stays_short(monkeypatch):
    """Nothing compiles in the interpreter, where a full-budget prefill costs seconds: the
    warm-up's long prompt is INTERPRETED_LONG_PROMPT tokens there (a suite that runs the design
    card's triton_mla command pays for it on every run.py)."""
    from lab.engine import warmup

    engine, _ = engine_of(f"max_num_batched_tokens={4 * BUDGET}")
    (long_request,), *_ = warmup_phases(engine)
    assert len(long_request.prompt_token_ids) == 4 * BUDGET
    monkeypatch.setattr(engine, "triton_interpreted", True)
    (long_request,), *_ = warmup_phases(engine)
    assert len(long_request.prompt_token_ids) == warmup.INTERPRETED_LONG_PROMPT
