"""async_scheduling=true through the real engine (tiny_llama, the model runner on its step
thread): the token ids, finish reasons, logprobs and seeded samples of async_scheduling=false on
the same workload; transformers' ids in the parity modes over both engine clients; aborts while
a step is in flight; a step that raises; per-step statistics; AsyncLLM; the simulator and the
multiproc executor. The scheduler's side (placeholders, preemption, swap, faults over many drawn
workloads) is tests/scheduler/test_async_scheduler.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from lab import LLM, SamplingParams
from lab.engine.async_llm import AsyncLLM
from lab.metrics.jsonl import STEPS_FILE, JsonlLogger
from tests.engine.parity_utils import MODES, check_greedy_parity, parity_fixtures

model_name, hf_outputs, mp_runs = parity_fixtures(["tiny_llama"], async_scheduling=True)

# chunked prefill (budget 16 < the longest prompts) and preemption (24 blocks of 4) at once
KNOBS = dict(attention="torch", block_size=4, num_gpu_blocks=24, max_model_len=64,
             max_num_batched_tokens=16)
PROMPTS = [[3 + i, 40 + i, 7, 8, 9 + i] * (1 + i % 4) for i in range(8)]


@pytest.mark.parametrize("mode", list(MODES))
def test_greedy_parity_with_transformers(model_name, hf_outputs, mode, engine_client, request):
    """The parity modes (default, chunked, prefix hits, preemption) give transformers' ids with
    async scheduling, in-process and from a core process (engine_client=mp)."""
    runs = request.getfixturevalue("mp_runs") if engine_client == "mp" else None
    check_greedy_parity(model_name, hf_outputs, mode, engine_client, runs,
                        async_scheduling=True)


def _params(stop_at: dict[int, int]) -> list[SamplingParams]:
    """Greedy with max_tokens, stop token ids (`stop_at`: prompt index -> id), logprobs and
    prompt logprobs, and seeded random sampling with n=2."""
    out = []
    for i in range(len(PROMPTS)):
        if i % 4 == 3:
            out.append(SamplingParams(temperature=0.9, top_p=0.9, seed=100 + i, n=2,
                                      max_tokens=7, ignore_eos=True))
        else:
            out.append(SamplingParams(
                temperature=0, max_tokens=6 + i, ignore_eos=True,
                stop_token_ids=[stop_at[i]] if i in stop_at else [],
                logprobs=2 if i % 2 else None, prompt_logprobs=1 if i == 2 else None))
    return out


def _generate(async_scheduling: bool, params, **knobs):
    """The outputs, the step statistics and how many tokens the runner sampled."""
    llm = LLM("tiny_llama", async_scheduling=async_scheduling, **(KNOBS | knobs))
    original, sampled = llm.engine.executor.execute_model, [0]

    def counting(sched):
        result = original(sched)
        sampled[0] += len(result.sampled_token_ids)
        return result

    llm.engine.executor.execute_model = counting
    try:
        outs = llm.generate(PROMPTS, params)
        while llm.engine.has_unfinished_requests():  # the step behind the last finish
            llm.engine.step()
        return outs, list(llm.engine.recent_steps), sampled[0]
    finally:
        llm.engine.shutdown()


def _same(a, b) -> None:
    """Equal ids, finish and stop reasons; logprobs equal to float tolerance (the steps'
    batches differ, so fp32 sums may round differently)."""
    assert [o.prompt_logprobs is None for o in a] == [o.prompt_logprobs is None for o in b]
    for x, y in zip(a, b):
        for cx, cy in zip(x.outputs, y.outputs, strict=True):
            assert (cx.token_ids, cx.finish_reason, cx.stop_reason) == \
                (cy.token_ids, cy.finish_reason, cy.stop_reason)
            assert (cx.logprobs is None) == (cy.logprobs is None)
            for lx, ly in zip(cx.logprobs or [], cy.logprobs or [], strict=True):
                assert lx.keys() == ly.keys()
                assert all(abs(lx[t].logprob - ly[t].logprob) < 1e-4 for t in lx)
        for lx, ly in zip(x.prompt_logprobs or [], y.prompt_logprobs or [], strict=True):
            assert (lx is None) == (ly is None)
            if lx is not None:
                assert all(abs(lx[t].logprob - ly[t].logprob) < 1e-4 for t in lx)


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_same_outputs_as_synchronous(preemption):
    """Chunked prefill, preemption (recompute; swap), stop token ids hit mid-generation,
    max_tokens, logprobs, prompt logprobs and seeded n=2 sampling: async == sync."""
    knobs = dict(preemption=preemption)
    if preemption == "swap":
        knobs["cache.swap_space_gb"] = 0.001
    plain, _, _ = _generate(False, _params({}), **knobs)
    # stop on the 3rd greedy token of some requests: they end by a token while the step
    # scheduled behind them is in flight
    stop_at = {i: plain[i].outputs[0].token_ids[2] for i in (0, 4, 5)}
    params = _params(stop_at)
    sync, _, sync_sampled = _generate(False, params, **knobs)
    async_, steps, sampled = _generate(True, params, **knobs)
    _same(sync, async_)
    assert {sync[i].outputs[0].finish_reason for i in stop_at} == {"stop"}
    assert sum(s.num_preempted for s in steps) > 0
    assert max(s.num_scheduled_tokens for s in steps) <= 16
    if preemption == "swap":
        assert sum(s.swap_out_blocks for s in steps) > 0
    # the runner samples one token more per request stopped by a token (dropped), none for a
    # request ended by length (it is not scheduled past its last token)
    assert sync_sampled <= sampled <= sync_sampled + len(stop_at)


def test_abort_while_a_step_is_in_flight():
    """An abort between steps frees the request's blocks at once; the step in flight that
    computes its next token delivers nothing for it; the others finish as without the abort."""
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    llm = LLM("tiny_llama", async_scheduling=True, **KNOBS)
    ref = [o.outputs[0].token_ids for o in LLM("tiny_llama", **KNOBS).generate(PROMPTS[:3], sp)]
    engine = llm.engine
    ids = [engine.add_request(p, sp) for p in PROMPTS[:3]]
    core_step, core_outputs = engine.core.step, []

    def step():  # what the core itself returns
        result = core_step()
        core_outputs.extend(result.outputs)
        return result

    engine.core.step = step
    got = {rid: [] for rid in ids}
    while len(got[ids[1]]) < 2:
        for out in engine.step():
            got[out.request_id] = list(out.outputs[0].token_ids)
    assert ids[1] in engine.core._in_flight[0].sched.num_scheduled_tokens  # its next token
    [final] = engine.abort_request([ids[1]])
    assert final.finished and final.outputs[0].finish_reason == "abort"
    assert engine.scheduler.kv.get_block_ids(ids[1]) == ([],)
    at_abort, core_outputs[:] = got[ids[1]], []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == ids[1]:  # its final output only, nothing computed after
                assert out.outputs[0].finish_reason == "abort"
                assert list(out.outputs[0].token_ids) == at_abort
            got[out.request_id] = list(out.outputs[0].token_ids)
    assert ids[1] not in {o.request_id for o in core_outputs}
    assert got[ids[0]] == ref[0] and got[ids[2]] == ref[2]
    assert at_abort == ref[1][: len(at_abort)]
    assert engine.scheduler.kv.num_used_blocks == 0
    engine.shutdown()


class Fault(Exception):
    pass


def test_a_step_that_raises_fails_only_its_requests():
    """executor.execute_model (run on the step thread) raises on its 3rd call: exactly that
    step's requests fail (reason error), the step scheduled behind it is taken back and its
    requests finish; the engine serves the next call with exact ids and holds nothing after."""
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    ref = LLM("tiny_llama", **KNOBS).generate(PROMPTS, sp)
    llm = LLM("tiny_llama", async_scheduling=True, **KNOBS)
    requeue, requeued = llm.engine.scheduler.requeue_step, []
    llm.engine.scheduler.requeue_step = lambda sched: requeued.extend(requeue(sched))
    executor, original = llm.engine.executor, llm.engine.executor.execute_model
    calls, failing = [0], []

    def execute(sched):
        calls[0] += 1
        if calls[0] == 3:
            failing.append(set(sched.num_scheduled_tokens))
            raise Fault
        return original(sched)

    executor.execute_model = execute
    engine = llm.engine
    ids = [engine.add_request(p, sp) for p in PROMPTS]
    finals = {}
    while engine.has_unfinished_requests():
        try:
            outs = engine.step()
        except Fault:
            continue
        finals |= {o.request_id: o for o in outs if o.finished}
    failed = {rid for rid, o in finals.items() if o.outputs[0].finish_reason == "error"}
    assert failed and failed == failing[0]
    # the skipped step admitted requests the failed one did not hold: taken back, not failed
    assert {r.request_id for r in requeued} - failed
    for rid, r in zip(ids, ref):
        if rid not in failed:
            assert finals[rid].outputs[0].token_ids == r.outputs[0].token_ids
    assert engine.scheduler.kv.num_used_blocks == 0 and not engine.scheduler.requests
    again = llm.generate(PROMPTS[:2], sp)
    assert [o.outputs[0].token_ids for o in again] == [r.outputs[0].token_ids for r in ref[:2]]
    engine.shutdown()


def test_stats_per_executed_step_reach_the_jsonl_logger(tmp_path):
    """One StepStats per step the executor ran, in order, through a JSONL logger; the last
    (a step behind the last finish) is emitted when the engine takes it in."""
    llm = LLM("tiny_llama", async_scheduling=True, **KNOBS)
    calls = [0]
    original = llm.engine.executor.execute_model

    def counting(sched):
        calls[0] += 1
        return original(sched)

    llm.engine.executor.execute_model = counting
    logger = JsonlLogger()
    logger.on_start(tmp_path)
    llm.engine.loggers.append(logger)
    sp = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    outs = llm.generate(PROMPTS[:4], sp)
    while llm.engine.has_unfinished_requests():  # a step may still be in flight
        llm.engine.step()
    records = [json.loads(line) for line in (tmp_path / STEPS_FILE).read_text().splitlines()]
    assert len(records) == calls[0] > 0
    assert [r["step"] for r in records] == list(range(len(records)))
    assert sum(r["num_generated_tokens"] for r in records) == sum(
        len(o.outputs[0].token_ids) for o in outs)
    assert all(r["execute_time"] >= 0 and r["schedule_time"] >= 0 for r in records)
    llm.engine.shutdown()


def test_shutdown_joins_the_step_thread():
    llm = LLM("tiny_llama", async_scheduling=True, **KNOBS)
    llm.generate(PROMPTS[:2], SamplingParams(max_tokens=3, ignore_eos=True))
    threads = list(llm.engine.executor._steps._pool._threads)
    assert [t.name.startswith("lab-step") and t.is_alive() for t in threads] == [True]
    llm.engine.shutdown()  # with a step still in flight (the one behind the last finish)
    assert not any(t.is_alive() for t in threads)


def test_async_llm_streams_the_synchronous_tokens():
    llm = LLM("tiny_llama", async_scheduling=True, **KNOBS)
    sp = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)
    ref = [o.outputs[0].token_ids for o in LLM("tiny_llama", **KNOBS).generate(PROMPTS[:3], sp)]
    a = AsyncLLM(llm.engine)

    async def one(prompt):
        ids = []
        async for out in a.generate(prompt, sp):
            ids = out.outputs[0].token_ids
        return ids

    async def main():
        return await asyncio.gather(*(one(p) for p in PROMPTS[:3]))

    try:
        assert asyncio.run(main()) == ref
    finally:
        a.shutdown()
        llm.engine.shutdown()


def test_simulator():
    """executor=sim steps the same way (its clock advances as each step is taken in)."""
    sp = SamplingParams(max_tokens=6, ignore_eos=True)
    outs = {}
    for flag in (False, True):
        llm = LLM("tiny_llama", executor="sim", async_scheduling=flag, num_gpu_blocks=64)
        outs[flag] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp)]
    assert outs[True] == outs[False]


def test_multiproc_tensor_parallel():
    """executor=multiproc sends step N+1 to the ranks before it reads step N's answer."""
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    ref = [o.outputs[0].token_ids for o in LLM("tiny_llama", **KNOBS).generate(PROMPTS[:4], sp)]
    llm = LLM("tiny_llama", async_scheduling=True, executor="multiproc", tensor_parallel_size=2,
              **KNOBS)
    try:
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:4], sp)] == ref
        assert llm.engine.executor.collective_rpc("model_info")[0].vocab_size > 0
    finally:
        llm.engine.shutdown()


def test_knob_is_validated():
    with pytest.raises(ValueError, match="async_scheduling"):
        LLM("tiny_llama", async_scheduling="yes")


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["torch", "triton_flash"])
def test_cuda_same_ids_as_synchronous(attention):
    """On CUDA the step thread launches the kernels (on the worker's device: the current device
    is per thread); fp32 so the ids cannot hinge on a batch's rounding."""
    import torch

    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    knobs = KNOBS | dict(device="cuda", dtype="float32", attention=attention)
    ids, devices = {}, {}
    for flag in (False, True):
        llm = LLM("tiny_llama", async_scheduling=flag, **knobs)
        ids[flag] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp)]
        if flag:
            devices = llm.engine.executor._steps.call(torch.cuda.current_device)
        llm.engine.shutdown()
    assert ids[True] == ids[False]
    assert devices == torch.cuda.current_device()
