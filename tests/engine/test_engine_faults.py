"""Faults the engine must survive (each test failed on the main before the fix): a step that
raises or is interrupted fails exactly its requests and the engine serves the next call; aborts
during generate(); request-id collisions; SamplingParams that change after validation; records
that grow without bound on a long-lived LLM; an empty step reported instead of a silent spin."""

from __future__ import annotations

import dataclasses
from collections import deque

import pytest

from lab import LLM, SamplingParams
from lab.engine.core import EngineStuckError
from lab.engine.llm_engine import RequestSpec
from lab.metrics.base import StatLogger

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
PROMPTS = [[3 + i, 40 + i, 7, 8, 9 + i] for i in range(8)]
SHARED = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]  # three full blocks of 4
KNOBS = dict(attention="torch", num_gpu_blocks=64, block_size=4, max_model_len=128)


class Fault(Exception):
    pass


def _llm(**knobs) -> LLM:
    return LLM("tiny_llama", **{**KNOBS, **knobs})


@pytest.fixture(scope="module")
def reference():
    """Greedy tokens of every prompt the tests use, from a run without faults."""
    llm = _llm()
    prompts = PROMPTS + [[7, 8, 9], SHARED + [5], SHARED + [6, 7]]
    return {tuple(p): o.outputs[0].token_ids for p, o in zip(prompts, llm.generate(prompts, GREEDY))}


def _inject(llm: LLM, on_calls: set[int], exc: BaseException | type = Fault) -> dict:
    """Make execute_model raise `exc` (before the worker runs) on the given call numbers."""
    executor, original = llm.engine.executor, llm.engine.executor.execute_model
    calls = {"n": 0}

    def execute(sched):
        calls["n"] += 1
        if calls["n"] - 1 in on_calls:
            raise exc
        return original(sched)

    executor.execute_model = execute
    return calls


def _bounded_steps(llm: LLM, limit: int = 500) -> None:
    """Fail instead of hanging when an engine spins on empty steps (the old wedge)."""
    step, count = llm.engine.step, {"n": 0}

    def counted():
        count["n"] += 1
        assert count["n"] < limit, "the engine spins: steps without progress"
        return step()

    llm.engine.step = counted


def _tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def _assert_clean(llm: LLM) -> None:
    engine = llm.engine
    assert not engine.scheduler.requests and not engine.has_unfinished_requests()
    assert engine.scheduler.kv.num_used_blocks == 0


def test_failed_step_fails_its_requests_and_the_next_call_is_served(reference):
    llm = _llm()
    _inject(llm, {2})
    _bounded_steps(llm)
    with pytest.raises(Fault):
        llm.generate(PROMPTS + [[7, 8, 9]], GREEDY)
    _assert_clean(llm)
    assert _tokens(llm.generate([[7, 8, 9]], GREEDY)) == [reference[(7, 8, 9)]]
    assert _tokens(llm.generate(PROMPTS, GREEDY)) == [reference[tuple(p)] for p in PROMPTS]
    _assert_clean(llm)


def test_step_api_reports_failed_requests_with_reason_error(reference):
    llm = _llm(max_num_seqs=4)
    engine = llm.engine
    _inject(llm, {1})
    ids = [engine.add_request(p, GREEDY) for p in PROMPTS]
    engine.step()
    with pytest.raises(Fault):
        engine.step()
    reported = engine.take_outputs(set(ids))
    failed = {o.request_id for o in reported if o.outputs[0].finish_reason == "error"}
    assert failed == set(ids[:4])  # the four the failing step scheduled
    assert all(o.metrics.finish_reason == "error" for o in reported)
    outs = {}
    while engine.has_unfinished_requests():
        outs.update({o.request_id: o for o in engine.step() if o.finished})
    assert not failed & set(outs)  # reported once, by take_outputs above
    for rid, prompt in zip(ids[4:], PROMPTS[4:]):  # not in the failing step: untouched, exact
        assert outs[rid].outputs[0].token_ids == reference[tuple(prompt)]
    _assert_clean(llm)


def test_failed_prefill_leaves_no_uncomputed_block_in_the_prefix_cache(reference):
    llm = _llm()
    llm.generate(PROMPTS, GREEDY)  # old KV contents in the blocks the next prompts will get
    _inject(llm, {0})
    with pytest.raises(Fault):
        llm.generate([SHARED + [5]], GREEDY)  # its blocks were committed, never computed
    outs = llm.generate([SHARED + [5], SHARED + [6, 7]], GREEDY)
    assert _tokens(outs) == [reference[tuple(SHARED + [5])], reference[tuple(SHARED + [6, 7])]]


def test_keyboard_interrupt_in_forward_leaves_the_llm_reusable(reference):
    llm = _llm()
    model = llm.engine.executor.worker.model
    forward, calls = model.forward, {"n": 0}

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return forward(*args, **kwargs)

    model.forward = interrupted
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, GREEDY)
    _assert_clean(llm)  # no request of the interrupted call is left running
    assert _tokens(llm.generate(PROMPTS, GREEDY)) == [reference[tuple(p)] for p in PROMPTS]
    assert set(llm.engine.executor.worker.runner.states) <= {
        r for r in llm.engine.scheduler.finished_req_ids}


def test_failed_steps_do_not_leak_worker_rows(reference):
    """A step that fails before the worker ran must re-send the ids the worker had to drop."""
    llm = _llm(max_num_seqs=2)
    llm.generate([[7, 8, 9]], GREEDY)
    for _ in range(3):
        _inject(llm, {0})
        with pytest.raises(Fault):
            llm.generate(PROMPTS[:2], GREEDY)
    llm.engine.executor.execute_model = llm.engine.executor.worker.execute_model
    assert _tokens(llm.generate(PROMPTS[:2], GREEDY)) == [reference[tuple(p)] for p in PROMPTS[:2]]
    runner = llm.engine.executor.worker.runner
    assert set(runner.states) <= llm.engine.scheduler.finished_req_ids


def test_an_empty_step_with_unfinished_requests_is_reported_not_spun(reference):
    llm = _llm()
    engine = llm.engine
    engine.scheduler.fail_step = lambda sched: []  # the old behaviour: nothing taken back
    _inject(llm, {1})
    ids = [engine.add_request(p, GREEDY) for p in PROMPTS[:3]]
    engine.step()
    with pytest.raises(Fault):
        engine.step()  # its requests stay RUNNING with every token marked computed
    with pytest.raises(EngineStuckError, match="scheduled no token"):
        engine.step()
    outs = engine.take_outputs(set(ids))
    assert len(outs) == 3 and all(o.outputs[0].finish_reason == "error" for o in outs)
    _assert_clean_after_steps(llm)
    assert _tokens(llm.generate([[7, 8, 9]], GREEDY)) == [reference[(7, 8, 9)]]


def _assert_clean_after_steps(llm: LLM) -> None:
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    _assert_clean(llm)


class _AbortFirstWaiting(StatLogger):
    def __init__(self) -> None:
        self.engine, self.aborted = None, None

    def on_step(self, stats) -> None:
        waiting = list(self.engine.scheduler.waiting)
        if self.aborted is None and waiting:
            self.aborted = waiting[-1].request_id
            self.engine.abort_request([self.aborted])

    def on_request(self, stats) -> None:
        pass


def test_abort_of_a_waiting_request_during_generate(reference):
    aborter = _AbortFirstWaiting()
    llm = _llm(max_num_seqs=2, stat_loggers=[aborter])
    aborter.engine = llm.engine
    outs = llm.generate(PROMPTS[:5], GREEDY)
    assert aborter.aborted is not None
    for prompt, out in zip(PROMPTS[:5], outs):
        if out.request_id == aborter.aborted:
            assert out.outputs[0].finish_reason == "abort" and out.finished
        else:
            assert out.outputs[0].token_ids == reference[tuple(prompt)]
    _assert_clean(llm)


def test_user_request_ids_never_collide_with_automatic_ones(reference):
    llm = _llm()
    engine = llm.engine
    engine.add_request([7, 8, 9], GREEDY, request_id="3")
    outs = llm.generate(PROMPTS, GREEDY)
    assert "3" not in {o.request_id for o in outs} and len({o.request_id for o in outs}) == 8
    assert _tokens(outs) == [reference[tuple(p)] for p in PROMPTS]
    rest = []
    while engine.has_unfinished_requests():  # "3" is reported to its owner, not lost
        rest += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in rest] == ["3"] and rest[0].outputs[0].token_ids == reference[
        (7, 8, 9)]
    added = []
    engine.core.add_request = _recording(engine.core.add_request, added)
    llm.generate(PROMPTS[:2], GREEDY)
    assert len(added) == 2  # the next call runs exactly its own requests


def _recording(add, into: list):
    def wrapped(req):
        into.append(req.request_id)
        return add(req)
    return wrapped


def test_adding_a_batch_is_all_or_nothing():
    llm = _llm()
    engine = llm.engine
    specs = [RequestSpec([3, 4]), RequestSpec([5, 6], request_id="x"), RequestSpec([7], request_id="x")]
    with pytest.raises(ValueError, match=r"requests\[2\].*'x' is already in use"):
        engine.add_requests(specs)
    with pytest.raises(ValueError, match=r"prompts\[2\]"):
        llm.generate([[3, 4], [5, 6], []], GREEDY)
    assert not engine.scheduler.requests and not engine.has_unfinished_requests()


def test_sampling_params_are_frozen_and_checked_where_requests_enter(reference):
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sp.temperature = float("nan")
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(temperature=0.8, seed=2**64)
    SamplingParams(temperature=0.8, seed=2**64 - 1)  # 64 bits: fine
    llm = _llm()
    forged = SamplingParams(temperature=0.5)
    object.__setattr__(forged, "temperature", float("nan"))  # around the frozen dataclass
    with pytest.raises(ValueError, match="temperature"):
        llm.generate([[7, 8, 9]], forged)
    with pytest.raises(TypeError, match="sampling_params must be a SamplingParams"):
        llm.generate([[7, 8, 9]], "greedy")
    as_dict = {"temperature": 0, "max_tokens": 6, "ignore_eos": True}
    assert _tokens(llm.generate([[7, 8, 9]], as_dict)) == [reference[(7, 8, 9)]]
    with pytest.raises(ValueError, match="tempreture"):
        llm.generate([[7, 8, 9]], {"tempreture": 0})
    _assert_clean(llm)


def test_seeded_request_with_a_64_bit_seed_runs():
    llm = _llm()
    sp = SamplingParams(temperature=0.8, seed=2**64 - 1, max_tokens=4)
    assert len(llm.generate([[7, 8, 9]], sp)[0].outputs[0].token_ids) == 4


def test_a_long_lived_llm_keeps_bounded_records():
    llm = _llm()
    engine = llm.engine
    engine.recent_steps, engine.recent_requests = deque(maxlen=4), deque(maxlen=4)
    llm.generate(PROMPTS, GREEDY)
    before = _footprint(engine)
    for _ in range(4):
        llm.generate(PROMPTS, GREEDY)
    assert _footprint(engine) == before


def _footprint(engine) -> dict[str, int]:
    """len() of every container the engine, its core, scheduler, cache manager, worker and
    runner hold as attributes (a record list that grows per call shows up here)."""
    runner = engine.executor.worker.runner
    owners = {"engine": engine, "core": engine.core, "scheduler": engine.scheduler,
              "kv": engine.scheduler.kv, "swap": engine.scheduler.kv.swap_space,
              "worker": engine.executor.worker, "runner": runner}
    return {f"{name}.{attr}": len(value)
            for name, obj in owners.items() for attr, value in vars(obj).items()
            if isinstance(value, list | dict | set | deque)}


def test_vllm_prompt_dicts(reference):
    llm = _llm()
    outs = llm.generate([{"prompt_token_ids": [7, 8, 9]}, {"prompt": "Hello"}], GREEDY)
    assert outs[0].outputs[0].token_ids == reference[(7, 8, 9)]
    assert outs[1].prompt == "Hello"
    assert outs[1].prompt_token_ids == llm.get_tokenizer().encode("Hello")
    with pytest.raises(ValueError, match="prompt_token_ids"):
        llm.generate([{"prompt_ids": [1]}], GREEDY)


def test_hf_option_uses_the_given_path():
    from lab.models.tiny import ensure_tiny_model

    path = str(ensure_tiny_model("tiny_qwen3"))
    llm = LLM("hf", num_gpu_blocks=32, **{"model.path": path})
    assert llm.cfg.model.path == path
    with pytest.raises(ValueError, match="model.path"):
        LLM("hf", num_gpu_blocks=32)


def test_a_failure_inside_the_scheduler_fails_every_request_and_resets(reference):
    """When update_from_output itself raises, the scheduler's state cannot be trusted: every
    unfinished request fails, every block is freed, the prefix cache is emptied."""
    llm = _llm(max_num_seqs=2)
    engine, update = llm.engine, llm.engine.scheduler.update_from_output
    calls = {"n": 0}

    def broken(sched, result):
        calls["n"] += 1
        if calls["n"] == 2:
            raise Fault
        return update(sched, result)

    engine.scheduler.update_from_output = broken
    ids = [engine.add_request(p, GREEDY) for p in PROMPTS[:4]]  # two run, two wait
    engine.step()
    with pytest.raises(Fault):
        engine.step()
    outs = engine.take_outputs(set(ids))
    assert len(outs) == 4 and all(o.outputs[0].finish_reason == "error" for o in outs)
    assert len(engine.scheduler.kv.block_pool.cached_block_hash_to_block) == 0
    _assert_clean_after_steps(llm)
    assert _tokens(llm.generate(PROMPTS[:4], GREEDY)) == [reference[tuple(p)] for p in PROMPTS[:4]]
