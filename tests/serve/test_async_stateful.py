"""Hypothesis state machine over the real engine behind AsyncLLM with engine_client=async_mp:
the core steps in its own process, the output handler runs on one asyncio loop (a background
thread here), and requests arrive, stream, and are aborted at random: by cancelling their
consumer task (the stream closes, which aborts) or by `async_llm.abort(request_id)` (on the
loop or from the test's thread), one or many at once. The consumer of a request aborted by id
gets one final output (finish reason abort) and nothing after it; it may go away at any time,
and a new request may take the id meanwhile (its stale stream must leave the new request alone:
the bug this machine found).

tiny_llama on a KV cache of 16 usable blocks of 4 tokens (the fewest that hold max_model_len=64),
4 requests at most of up to 32 tokens each, arriving alone or in bursts, some sharing a prefix:
requests get preempted (and recomputed) under one another.

At the end of every example: each request that was not aborted streamed exactly the greedy
tokens of its prompt computed alone (a reference LLM); each aborted one streamed a prefix of
them, ended with finish reason abort when aborted by id, and got nothing delivered after its
abort landed (or had finished before); the core holds
no request and no KV block, no consumer is left, the engine is healthy. Over the module, some
steps preempted.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from lab.config.compose import compose_config
from lab.core.sampling_params import RequestOutputKind, SamplingParams
from lab.engine.async_llm import AsyncLLM
from lab.engine.llm import LLM
from lab.metrics.memory import InMemoryLogger

MAX_NUM_SEQS = 4
ENGINE = ["model=tiny_llama", "logger=[]", "engine_client=async_mp", "attention=torch",
          "block_size=4", "num_gpu_blocks=17", "max_model_len=64", f"max_num_seqs={MAX_NUM_SEQS}",
          "max_num_batched_tokens=16"]
REFERENCE = dict(attention="torch", block_size=4, num_gpu_blocks=64, max_model_len=64)
TIMEOUT_S = 30.0  # one wait on the loop; a hang fails the example instead of the suite
# the length first (lists' own sizes lean small): long prompts make the requests compete
PROMPT = st.integers(1, 20).flatmap(
    lambda n: st.lists(st.integers(3, 499), min_size=n, max_size=n))
MAX_TOKENS = st.integers(1, 12)
HOWS = ["cancel", "abort_on_loop", "abort_from_thread"]


class Harness:
    """One AsyncLLM (core process), the event loop that serves it, a reference LLM."""

    def __init__(self) -> None:
        self.logger = InMemoryLogger()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="async-machine",
                                       daemon=True)
        self.thread.start()
        self.a = AsyncLLM.from_config(compose_config(ENGINE), loggers=[self.logger])
        self.ref_llm = LLM("tiny_llama", **REFERENCE)
        self._refs: dict[tuple[tuple[int, ...], int], list[int]] = {}
        self.ids = itertools.count()
        self.preempting_examples: list[int] = []  # per example: steps that preempted

    def run(self, coro, timeout: float = TIMEOUT_S):
        """Run a coroutine on the loop and wait for its result (from the test's thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def reference(self, prompt: tuple[int, ...], max_tokens: int) -> list[int]:
        key = (prompt, max_tokens)
        if key not in self._refs:
            sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
            self._refs[key] = list(self.ref_llm.generate([list(prompt)], sp)[0]
                                   .outputs[0].token_ids)
        return self._refs[key]

    def num_preempting_steps(self) -> int:
        return sum(s.num_preempted > 0 for s in self.logger.steps)

    def close(self) -> None:
        async def stop():
            self.a.shutdown()  # on the loop: cancels the output handler there
            await asyncio.sleep(0)

        try:
            self.run(stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@pytest.fixture(scope="module")
def harness():
    h = Harness()
    yield h
    h.close()


@dataclass
class Req:
    rid: str
    prompt: tuple[int, ...]
    max_tokens: int
    task: asyncio.Task | None = None
    queue: asyncio.Queue | None = None  # the stream's queue: outputs delivered, not yet read
    ids: list[int] = field(default_factory=list)
    num_outputs: int = 0
    finished: bool = False
    finish_reason: str | None = None
    aborted: str | None = None  # how
    allowed_outputs: int | None = None  # what the consumer may read once its abort landed
    left: bool = False  # its consumer was cancelled after an abort by id


class AsyncMachine(RuleBasedStateMachine):
    def __init__(self, h: Harness) -> None:
        super().__init__()
        self.h, self.a = h, h.a
        self.reqs: list[Req] = []
        self.steps_at_start = len(h.logger.steps)

    # -- on the loop ---------------------------------------------------------------------------
    async def _consume(self, req: Req, sp: SamplingParams) -> None:
        for _ in range(int(TIMEOUT_S / 0.005)):
            try:
                stream = await self.a.add_request(list(req.prompt), sp, req.rid)
                break
            except ValueError as e:  # a reused id: until the core let go of its aborted holder
                if "already in use" not in str(e):
                    raise
                await asyncio.sleep(0.005)
        else:
            raise AssertionError(f"request id {req.rid!r} stayed in use")
        req.queue = stream._stream.queue  # a peek for the abort's check, never read here
        async for out in stream:
            req.num_outputs += 1
            req.ids += out.outputs[0].token_ids
            req.finished = out.finished
            req.finish_reason = out.outputs[0].finish_reason

    async def _arrive(self, reqs: list[Req]) -> None:
        for req in reqs:
            sp = SamplingParams(temperature=0, max_tokens=req.max_tokens, ignore_eos=True,
                                output_kind=RequestOutputKind.DELTA)
            req.task = asyncio.create_task(self._consume(req, sp), name=req.rid)
        await asyncio.sleep(0)  # the consumers add their requests
        while any(r.queue is None and not r.task.done() for r in reqs):  # a reused id: retrying
            await asyncio.sleep(0.005)

    def _landed(self, req: Req) -> None:
        """On the loop, once `async_llm.abort` ran there: its final output is queued (or read),
        nothing is delivered after it."""
        req.allowed_outputs = req.num_outputs + req.queue.qsize()

    async def _abort(self, reqs: list[Req], hows: list[str]) -> None:
        """Abort these requests in one go (no await between them)."""
        cancelled = []
        for req, how in zip(reqs, hows):
            req.aborted = how
            if how == "cancel":
                req.task.cancel()  # closing its stream aborts the request
                cancelled.append(req.task)
            else:
                self.a.abort(req.rid)
                self._landed(req)
        await asyncio.gather(*cancelled, return_exceptions=True)

    async def _wait_outputs(self, n: int) -> None:
        """Until `n` more outputs reached consumers, or every consumer is done (1 s at most)."""
        def total():
            return sum(r.num_outputs for r in self.reqs)
        goal = total() + n
        for _ in range(200):
            if total() >= goal or all(r.task.done() for r in self.reqs if not r.aborted):
                return
            await asyncio.sleep(0.005)

    async def _finish(self):
        """Every consumer ended; the core's status once it holds no request."""
        # consumers of async_llm.abort may not have read their final output yet; they go
        # first, and closing their streams must leave the live requests (one may reuse the id)
        # alone
        for req in self._waiting():
            req.task.cancel()
        live = [r.task for r in self.reqs if not r.aborted]
        if live:
            _, pending = await asyncio.wait(live, timeout=TIMEOUT_S)
            assert not pending, f"{len(pending)} requests never finished"
        await asyncio.gather(*(r.task for r in self.reqs), return_exceptions=True)
        for _ in range(500):  # aborts reach the core asynchronously
            status = await self.a.get_status()
            if status.num_requests == 0:
                break
            await asyncio.sleep(0.01)
        return status

    # -- rules ---------------------------------------------------------------------------------
    @rule(prompt=PROMPT, max_tokens=MAX_TOKENS)
    def arrive(self, prompt, max_tokens):
        self.h.run(self._arrive([self._new(prompt, max_tokens)]))

    @rule(reqs=st.lists(st.tuples(PROMPT, MAX_TOKENS), min_size=2, max_size=4))
    def arrive_many(self, reqs):
        """A burst: several requests added in one go, so they compete for the KV cache."""
        self.h.run(self._arrive([self._new(p, m) for p, m in reqs]))

    @precondition(lambda self: self.reqs)
    @rule(data=st.data(), max_tokens=MAX_TOKENS)
    def arrive_sharing(self, data, max_tokens):
        """A prompt that starts with an earlier one's tokens: prefix-cache hits, shared
        blocks."""
        base = data.draw(st.sampled_from(self.reqs)).prompt
        k = data.draw(st.integers(1, len(base)))
        tail = data.draw(st.lists(st.integers(3, 499), max_size=20 - k))
        self.h.run(self._arrive([self._new(list(base[:k]) + tail, max_tokens)]))

    @precondition(lambda self: self._reusable())
    @rule(data=st.data(), prompt=PROMPT, max_tokens=MAX_TOKENS)
    def arrive_reusing_id(self, data, prompt, max_tokens):
        """A request under the id of an aborted one (accepted once the core let go of it)."""
        rid = data.draw(st.sampled_from(self._reusable())).rid
        self.h.run(self._arrive([self._new(prompt, max_tokens, rid)]))

    def _new(self, prompt: list[int], max_tokens: int, rid: str | None = None) -> Req:
        req = Req(rid or f"m{next(self.h.ids)}", tuple(prompt), max_tokens)
        self.reqs.append(req)
        return req

    def _reusable(self) -> list[Req]:
        """Aborted requests whose id no later request took."""
        latest = {r.rid: r for r in self.reqs}
        return [r for r in latest.values() if r.aborted]

    def _waiting(self) -> list[Req]:
        """Requests aborted by id whose consumer may still wait (unless they finished first)."""
        return [r for r in self.reqs if r.aborted in HOWS[1:] and not r.left]

    def _live(self) -> list[Req]:
        """The requests not aborted yet, finished or not: whether one finished depends on
        timing, and hypothesis must replay the same draws (it may have finished before the
        abort lands: the checks allow it)."""
        return [r for r in self.reqs if not r.aborted]

    @precondition(lambda self: self._live())
    @rule(data=st.data(), how=st.sampled_from(HOWS))
    def abort(self, data, how):
        req = data.draw(st.sampled_from(self._live()))
        if how == "abort_from_thread":  # lands through call_soon_threadsafe
            self.a.abort(req.rid)
            req.aborted = how

            async def landed():  # runs after the abort's callback (FIFO)
                self._landed(req)
            self.h.run(landed())
        else:
            self.h.run(self._abort([req], [how]))

    @precondition(lambda self: len(self._live()) >= 2)
    @rule(data=st.data())
    def abort_many(self, data):
        live = self._live()
        reqs = data.draw(st.lists(st.sampled_from(live), min_size=2, max_size=len(live),
                                  unique_by=lambda r: r.rid))
        hows = data.draw(st.lists(st.sampled_from(HOWS[:2]), min_size=len(reqs),
                                  max_size=len(reqs)))
        self.h.run(self._abort(reqs, hows))

    @precondition(lambda self: self._waiting())
    @rule(data=st.data())
    def leave(self, data):
        """The consumer of a request aborted by id goes away (a client that disconnects after
        the server aborted its request): closing its stream touches no other request."""
        req = data.draw(st.sampled_from(self._waiting()))
        req.left = True

        async def cancel():
            req.task.cancel()
            await asyncio.gather(req.task, return_exceptions=True)
        self.h.run(cancel())

    @rule(seconds=st.sampled_from([0.01, 0.02, 0.05]))
    def sleep(self, seconds):
        self.h.run(asyncio.sleep(seconds))

    @precondition(lambda self: self._live())
    @rule(n=st.integers(1, 4))
    def wait_outputs(self, n):
        self.h.run(self._wait_outputs(n))

    @rule()
    def status(self):
        """The core's status mid-run (a utility call answered between step results): within
        the engine's limits, and no block in use while it holds no request."""
        unfinished = sum(not r.finished for r in self.reqs)  # before the call: the core is ahead
        s = self.h.run(self.a.get_status())
        assert s.num_running <= MAX_NUM_SEQS and s.num_used_blocks <= s.num_blocks, s
        assert s.num_requests <= unfinished, (s, unfinished)
        assert s.num_requests == s.num_running + s.num_waiting + s.num_swapped_reqs, s
        if s.num_requests == 0:
            assert s.num_used_blocks == 0, s

    @invariant()
    def healthy(self):
        assert self.a.is_healthy
        for req in self.reqs:
            if req.task.done() and not req.task.cancelled():
                assert req.task.exception() is None, req.task.exception()

    def teardown(self):
        status = self.h.run(self._finish(), timeout=3 * TIMEOUT_S)
        for req in self.reqs:
            if not req.task.cancelled():
                assert req.task.exception() is None, (req.rid, req.task.exception())
            ref = self.h.reference(req.prompt, req.max_tokens)
            if not req.aborted or req.finish_reason == "length":
                assert req.finished and req.ids == ref, (req, ref)
            else:
                assert req.ids == ref[:len(req.ids)], (req, ref)
            if req.aborted in HOWS[1:] and not req.left:  # aborted by id, consumer stayed
                assert req.finished and req.finish_reason in ("abort", "length"), req
            if req.allowed_outputs is not None:
                assert req.num_outputs <= req.allowed_outputs, req
        assert (status.num_requests, status.num_used_blocks, status.num_swapped_reqs) == \
            (0, 0, 0), status
        assert self.a.num_unfinished() == 0 and self.a.is_healthy
        engine = self.a.engine
        assert not engine.has_unfinished_requests() and not engine.output_processor.states
        self.h.preempting_examples.append(
            sum(s.num_preempted > 0 for s in self.h.logger.steps[self.steps_at_start:]))


def test_async_machine(harness):
    run_state_machine_as_test(
        lambda: AsyncMachine(harness),
        settings=settings(max_examples=25, stateful_step_count=20, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]))  # a real engine
    tally = harness.num_preempting_steps()
    per_example = harness.preempting_examples
    print(f"\npreempting steps: {tally} of {len(harness.logger.steps)} over "
          f"{len(per_example)} examples; examples with a preemption: "
          f"{sum(n > 0 for n in per_example)}")
    assert tally > 0, "no step preempted: the KV cache is too large for the machine's requests"
