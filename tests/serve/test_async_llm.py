"""AsyncLLM over each of its clients — `inproc` (an engine thread) and `async_mp` (the core in
its own process, an output-handler task on the event loop): outputs equal LLM.generate;
consumers that stop abort and free their blocks; a failed step fails only its requests;
shutdown ends every stream."""

import asyncio
import threading

import pytest

from lab.config.compose import compose_config
from lab.core.sampling_params import RequestOutputKind, SamplingParams
from lab.engine.async_llm import AsyncLLM, EngineStepError
from lab.engine.core import EngineDeadError
from lab.engine.llm import LLM

KW = dict(attention="torch", num_gpu_blocks=64, block_size=4, max_model_len=128)
CLIENTS = ["inproc", "async_mp"]


def _config(client: str, *extra: str):
    return compose_config(["model=tiny_llama", "logger=[]", f"engine_client={client}",
                           *(f"{k}={v}" for k, v in KW.items()), *extra])


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny_llama", **KW)


@pytest.fixture(scope="module", params=CLIENTS)
def async_llm(request):
    a = AsyncLLM.from_config(_config(request.param))
    yield a
    a.shutdown()


async def _settle(a: AsyncLLM):
    """The core's status once no request is left in it (aborts are asynchronous over mp)."""
    for _ in range(250):
        status = await a.get_status()
        if status.num_requests == 0:
            return status
        await asyncio.sleep(0.02)
    return status


def test_generate_delta_and_abort(llm, async_llm):
    a = async_llm
    ref = [llm.generate(p, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
           .outputs[0] for p in ("Hello", "Once upon")]

    async def one(prompt, rid):
        text, ids = "", []
        async for out in a.generate(prompt, SamplingParams(
                temperature=0, max_tokens=10, ignore_eos=True,
                output_kind=RequestOutputKind.DELTA), rid):
            text += out.outputs[0].text
            ids += out.outputs[0].token_ids
        return text, ids

    async def early(rid):
        async for _ in a.generate("Hello", SamplingParams(max_tokens=100, ignore_eos=True), rid):
            break  # closing the generator aborts the request

    async def main():
        res = await asyncio.gather(one("Hello", "a"), one("Once upon", "b"), early("c"))
        return res, await _settle(a)

    ((t1, i1), (t2, i2), _), status = asyncio.run(main())
    assert (t1, i1) == (ref[0].text, ref[0].token_ids)
    assert (t2, i2) == (ref[1].text, ref[1].token_ids)
    assert (status.num_requests, status.num_used_blocks) == (0, 0)
    assert a.num_unfinished() == 0 and a.is_healthy


def test_a_second_event_loop_is_served_too(llm, async_llm):
    """asyncio.run after asyncio.run (a notebook, a test suite): the next loop is served."""
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True,
                        output_kind=RequestOutputKind.FINAL_ONLY)

    async def main():
        return [o async for o in async_llm.generate("Hi", sp)][-1].outputs[0].token_ids

    assert asyncio.run(main()) == asyncio.run(main()) == \
        llm.generate("Hi", sp)[0].outputs[0].token_ids


def test_bad_request_raises_before_output(async_llm):
    async def main():
        with pytest.raises(ValueError, match="prompt"):
            await async_llm.add_request([], SamplingParams())
        return await async_llm.get_status()
    assert asyncio.run(main()).num_requests == 0


@pytest.mark.parametrize("leave", ["cancel", "stream_abort"])
def test_a_stale_stream_leaves_a_reused_id_alone(llm, async_llm, leave):
    """Found by tests/serve/test_async_stateful.py: a request aborted by id leaves its consumer
    waiting; once the core let go of it, a new request may take the id. When the old consumer
    then stops (cancelled, or its stream's abort()), it aborted the new request by id, whose
    consumer waited forever. A stream aborts only its own request now."""
    a = async_llm
    delta = dict(temperature=0, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    new_prompt = [61, 91, 3, 315, 258, 256]
    ref = llm.generate([new_prompt], SamplingParams(temperature=0, max_tokens=10,
                                                    ignore_eos=True))[0].outputs[0].token_ids

    async def main():
        old = await a.add_request([91, 40, 17, 268, 339, 276, 454, 286],
                                  SamplingParams(max_tokens=9, **delta), "x")
        old_outs = []

        async def consume_old():
            async for out in old:
                old_outs.append(out)

        task = asyncio.create_task(consume_old())
        while not old_outs:
            await asyncio.sleep(0.001)
        a.abort("x")  # the old consumer gets its final output (abort); its stream stays open
        for _ in range(1000):  # until the core let go of "x"
            try:
                new = await a.add_request(new_prompt, SamplingParams(max_tokens=10, **delta), "x")
                break
            except ValueError:
                await asyncio.sleep(0.005)
        if leave == "cancel":
            task.cancel()
        else:
            old.abort()
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        ids = [t async for out in new for t in out.outputs[0].token_ids]
        return ids, await _settle(a)

    ids, status = asyncio.run(asyncio.wait_for(main(), 30))  # before the fix: a timeout
    assert ids == ref
    assert (status.num_requests, status.num_used_blocks) == (0, 0)
    assert a.num_unfinished() == 0 and a.is_healthy


@pytest.mark.parametrize("client", CLIENTS)
def test_failed_step_fails_only_its_consumers(client):
    a = AsyncLLM.from_config(_config(
        client, "executor._target_=tests.serve.flaky_executor.FlakyExecutor",
        "+executor.fail_on_calls=[2]"))
    try:
        async def main():
            with pytest.raises(EngineStepError, match="injected fault"):
                async for _ in a.generate("Hello", SamplingParams(max_tokens=20, ignore_eos=True)):
                    pass
            outs = [o async for o in a.generate("Hello", SamplingParams(max_tokens=3))]
            return outs[-1], await _settle(a)

        last, status = asyncio.run(main())
        assert last.finished and a.is_healthy and status.num_used_blocks == 0
    finally:
        a.shutdown()


def test_shutdown_ends_every_stream(llm):
    """... and stops the tokenizer's thread: a later tokenize is refused like a request."""
    a = AsyncLLM(llm.engine)
    before = set(threading.enumerate())
    started = []

    async def main():
        assert await a.tokenize("Hello") == llm.get_tokenizer().encode("Hello")
        started.extend(t for t in threading.enumerate()
                       if t not in before and t.name.startswith("lab-tokenizer"))
        stream = await a.add_request("Hello", SamplingParams(max_tokens=100, ignore_eos=True))
        a.shutdown()
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass
        with pytest.raises(EngineDeadError):
            await a.add_request("Hello", SamplingParams())
        with pytest.raises(EngineDeadError):
            await a.tokenize("Hello")

    asyncio.run(main())
    assert not a.is_healthy
    assert llm.engine.scheduler.kv.num_used_blocks == 0
    assert len(started) == 1 and not started[0].is_alive()


@pytest.mark.parametrize("kind", [RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE])
def test_a_consumer_that_falls_behind_gets_one_merged_output(llm, async_llm, kind):
    """Outputs queued behind a slow consumer come as one (vLLM's RequestOutputCollector):
    DELTA ones merged, CUMULATIVE ones replaced by the newest; nothing is lost."""
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, output_kind=kind)
    ref = llm.generate("Once upon", sp)[0].outputs[0]

    async def main():
        stream = await async_llm.add_request("Once upon", sp)
        await _settle(async_llm)  # the request finished while nobody read its stream
        return [o async for o in stream]

    (out,) = asyncio.run(main())
    assert out.finished
    assert (out.outputs[0].text, out.outputs[0].token_ids) == (ref.text, ref.token_ids)


def test_abort_by_id_ends_the_consumer_with_an_abort_output(async_llm):
    """async_llm.abort(id): the consumer's stream ends with a final output, finish reason
    abort, and nothing after it (before: over async_mp it waited forever, or got the tokens
    the core computed until the abort landed). The abort comes while an output already waits
    in the stream's queue: that output is not delivered either (before: inproc gave it, a
    flaky 4th output in CI)."""
    a = async_llm
    sp = SamplingParams(max_tokens=100, ignore_eos=True, output_kind=RequestOutputKind.DELTA)

    async def main():
        outs = []
        stream = await a.add_request("Hello", sp, "to-abort")
        async for out in stream:
            outs.append(out)
            if len(outs) == 2:
                while stream._stream.queue.empty():  # the engine computed more meanwhile
                    await asyncio.sleep(0.001)
                a.abort("to-abort")
        return outs, await _settle(a)

    outs, status = asyncio.run(asyncio.wait_for(main(), 30))
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"
    assert len(outs) == 3 and not outs[-1].outputs[0].token_ids
    assert (status.num_requests, status.num_used_blocks) == (0, 0)


def test_stat_loggers_added_while_running_get_the_next_steps(async_llm):
    """add_stat_logger (what the server's /metrics uses): the logger sees the steps of requests
    served after it was added, over either client; max_logprobs is the engine's limit."""
    from lab.metrics.memory import InMemoryLogger

    a = async_llm
    logger = InMemoryLogger()
    a.add_stat_logger(logger)
    assert a.stat_loggers[-1] is logger
    assert a.max_logprobs == a.engine.processor.max_logprobs

    async def run():
        async for _ in a.generate([5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True)):
            pass

    asyncio.run(run())
    assert logger.steps and sum(s.num_generated_tokens for s in logger.steps) >= 3
