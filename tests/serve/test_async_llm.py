"""AsyncLLM: outputs equal LLM.generate; consumers that stop abort; a failed step fails only
its requests; shutdown."""

import asyncio

import pytest

from lab.engine.async_llm import AsyncLLM, EngineStepError
from lab.engine.llm import LLM
from lab.sampling.params import RequestOutputKind, SamplingParams

KW = dict(attention="torch", num_gpu_blocks=64, block_size=4, max_model_len=128)


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny_llama", **KW)


def test_generate_delta_and_abort(llm):
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    ref = [llm.generate(p, sp)[0].outputs[0] for p in ("Hello", "Once upon")]
    a = AsyncLLM(llm.engine)
    try:
        async def one(prompt, rid):
            text, ids = "", []
            async for out in a.generate(prompt, SamplingParams(
                    temperature=0, max_tokens=10, ignore_eos=True,
                    output_kind=RequestOutputKind.DELTA), rid):
                text += out.outputs[0].text
                ids += out.outputs[0].token_ids
            return text, ids

        async def early(rid):
            async for _ in a.generate("Hello", SamplingParams(max_tokens=100, ignore_eos=True),
                                      rid):
                break  # closing the generator aborts the request

        async def main():
            res = await asyncio.gather(one("Hello", "a"), one("Once upon", "b"), early("c"))
            for _ in range(200):
                with a.lock:
                    idle = not a.engine.has_unfinished_requests()
                if idle:
                    break
                await asyncio.sleep(0.02)
            return res

        (t1, i1), (t2, i2), _ = asyncio.run(main())
        assert (t1, i1) == (ref[0].text, ref[0].token_ids)
        assert (t2, i2) == (ref[1].text, ref[1].token_ids)
        assert llm.engine.scheduler.kv.num_used_blocks == 0
        assert a.is_healthy
    finally:
        a.shutdown()
    assert not a.is_healthy


def test_bad_request_raises_before_output(llm):
    a = AsyncLLM(llm.engine)
    try:
        async def main():
            with pytest.raises(ValueError, match="prompt"):
                await a.add_request([], SamplingParams())
        asyncio.run(main())
    finally:
        a.shutdown()


def test_failed_step_fails_only_its_consumers(llm, monkeypatch):
    a = AsyncLLM(llm.engine)
    executor = llm.engine.executor
    real = executor.execute_model
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return real(*args, **kwargs)

    monkeypatch.setattr(executor, "execute_model", flaky)
    try:
        async def main():
            with pytest.raises(EngineStepError):
                async for _ in a.generate("Hello", SamplingParams(max_tokens=20, ignore_eos=True)):
                    pass
            outs = [o async for o in a.generate("Hello", SamplingParams(max_tokens=3))]
            return outs[-1]

        last = asyncio.run(main())
        assert last.finished and a.is_healthy
    finally:
        a.shutdown()
