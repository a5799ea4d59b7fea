"""Faults of a server whose engine core runs in its own process (engine_client=async_mp, lab
serve's default): 200 concurrent streams of which random ones disconnect. (The core killed or
stopped mid-stream is driven through a real `lab serve` in test_serve_process.py.)"""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest

from lab.config.compose import compose_config
from lab.core.sampling_params import SamplingParams
from lab.engine.async_llm import AsyncLLM
from lab.engine.llm import LLM
from lab.serve.api_server import build_app
from tests.serve.conftest import CLIENT_TIMEOUT_S
from tests.serve.uvicorn_thread import serving, wait_idle

KW = dict(attention="torch", block_size=4, max_model_len=128)
PROMPTS = ["The quick brown fox", "Once upon a time", "Hello there", "A B C D E F"]
MAX_TOKENS = 12


def _async_llm(*extra: str) -> AsyncLLM:
    return AsyncLLM.from_config(compose_config(
        ["model=tiny_llama", "logger=[]", "engine_client=async_mp",
         *(f"{k}={v}" for k, v in KW.items()), *extra]))


def _sse_data(line: str) -> dict | None:
    if not line.startswith("data: ") or line == "data: [DONE]":
        return None
    return json.loads(line[len("data: "):])


@pytest.fixture(scope="module")
def served():
    """(base URL, AsyncLLM) of one async_mp server for the tests that do not kill it."""
    a = _async_llm("num_gpu_blocks=800")
    try:
        with serving(build_app(a, "tiny_llama")) as url:
            yield url, a
    finally:
        a.shutdown()


@pytest.fixture(scope="module")
def reference_llm():
    return LLM("tiny_llama", num_gpu_blocks=64, **KW)


def test_200_streams_with_random_disconnects(served, reference_llm):
    url, a = served
    ref = reference_llm.generate(
        PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))
    expected = {p: o.outputs[0].text for p, o in zip(PROMPTS, ref)}
    rng = random.Random(0)
    cuts = [rng.choice([None, None, 1, 2, 4]) for _ in range(200)]  # chunks read before leaving

    async def one(client: httpx.AsyncClient, i: int):
        body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": MAX_TOKENS,
                "temperature": 0, "ignore_eos": True, "stream": True}
        text, n = "", 0
        async with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                data = _sse_data(line)
                if data is None:
                    continue
                assert "error" not in data, data
                text += data["choices"][0]["text"]
                n += 1
                if cuts[i] is not None and n >= cuts[i]:
                    return None  # leaving the block closes the connection mid-stream
        return text

    async def main():
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT_S, limits=limits) as c:
            return await asyncio.gather(*(one(c, i) for i in range(200)))

    texts = asyncio.run(main())
    assert sum(c is not None for c in cuts) > 50  # the disconnects happen
    for i, text in enumerate(texts):
        if cuts[i] is None:
            assert text == expected[PROMPTS[i % len(PROMPTS)]], i
    status = wait_idle(a)
    assert (status.num_requests, status.num_used_blocks) == (0, 0), status
    assert a.num_unfinished() == 0
    assert httpx.get(url + "/health").status_code == 200


def test_n_and_stop_through_the_server(served, reference_llm):
    """n > 1 and stop strings over async_mp: n choices, each stopped at its stop string; the
    greedy one equals LLM.generate's text, finish and stop reasons."""
    url, _ = served
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=["e"])
    ref = reference_llm.generate(PROMPTS[0], sp)[0].outputs[0]
    body = {"prompt": PROMPTS[0], "max_tokens": 24, "ignore_eos": True, "stop": ["e"]}
    with httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT_S) as c:
        r = c.post("/v1/completions", json=body | {"n": 3, "temperature": 0.8,
                                                   "seed": 5}).json()
        assert sorted(ch["index"] for ch in r["choices"]) == [0, 1, 2]
        for ch in r["choices"]:
            assert "e" not in ch["text"] and ch["finish_reason"] in ("stop", "length")
        greedy = c.post("/v1/completions", json=body | {"temperature": 0}).json()["choices"][0]
    assert (greedy["text"], greedy["finish_reason"], greedy["stop_reason"]) == \
        (ref.text, ref.finish_reason, ref.stop_reason)
