"""Faults of an engine core in its own process that used to leave the frontend waiting forever:
a core that is stopped (SIGSTOP) kept `is_healthy` True while its requests waited; one bad
input frame killed the core's input thread silently (the process lived on, so no
EngineDeadError, and every later request waited). Now the core sends heartbeats and a silent one
is declared dead (knob core_timeout_s), a frame that names its request fails that request alone,
and any other IO fault ends the core loudly. Each test bounds its waits. (A stopped core, idle
past core_timeout_s first, is driven through a real `lab serve` in
tests/serve/test_serve_process.py.)"""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import zmq

from lab.config.compose import compose_config
from lab.core.protocol import EngineCoreOutput, EngineCoreOutputs
from lab.core.sampling_params import RequestOutputKind, SamplingParams
from lab.engine.async_llm import AsyncLLM, EngineStepError
from lab.engine.core import EngineDeadError
from lab.engine.core_proc import ADD, EngineCoreProc, is_heartbeat
from lab.engine.serial import MessageCodec

KW = dict(attention="torch", num_gpu_blocks=64, block_size=4, max_model_len=128)
DEADLINE_S = 60.0  # generous: the faults are noticed within seconds
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True,
                        output_kind=RequestOutputKind.FINAL_ONLY)
LONG = SamplingParams(max_tokens=100, ignore_eos=True)


def _async_llm(*extra: str) -> AsyncLLM:
    return AsyncLLM.from_config(compose_config(
        ["model=tiny_llama", "logger=[]", "engine_client=async_mp",
         *(f"{k}={v}" for k, v in KW.items()), *extra]))


async def _final(a: AsyncLLM, prompt, params=GREEDY):
    """The request's last output, or the error its stream raised, within DEADLINE_S."""
    async def last():
        outs = [out async for out in a.generate(prompt, params)]
        return outs[-1]
    return await asyncio.wait_for(last(), DEADLINE_S)


def _stop_for_good(a: AsyncLLM) -> None:
    """Shut the engine down; whatever a failed test left (a stopped core) is killed."""
    proc = a.engine.core.proc
    a.shutdown()
    if proc.is_alive():
        proc.kill()
        proc.join(10)


def _corrupt_next_request(a: AsyncLLM) -> None:
    """The next request crosses to the core with its id but a field of the wrong type."""
    codec = a.engine.core.codec
    encode = codec.encode

    def corrupt(message):
        codec.encode = encode  # once
        fields = msgspec.to_builtins(message)
        return msgspec.msgpack.encode({**fields, "prompt_token_ids": "not token ids"})

    codec.encode = corrupt


def test_a_bad_frame_fails_its_request_alone_and_an_unreadable_one_kills_the_core():
    a = _async_llm()

    async def main():
        _corrupt_next_request(a)
        with pytest.raises(EngineStepError, match=r"refused: it does not decode: "
                                                  r".*prompt_token_ids"):
            await _final(a, [3, 4, 5])
        assert a.is_healthy  # the core serves on
        assert len((await _final(a, [3, 4, 5])).outputs[0].token_ids) == 4

        a.engine.core.input.send_multipart([ADD, b"\xc1 not a request"])
        with pytest.raises(EngineDeadError, match=r"died with exit code 70: it stopped on a "
                                                  r"fault"):
            await _final(a, [3, 4, 5], LONG)
        assert not a.is_healthy

    try:
        asyncio.run(main())
    finally:
        _stop_for_good(a)


class _Unsendable:
    """Statistics msgpack cannot encode (a step's result that cannot cross)."""


def test_an_output_that_does_not_encode_fails_its_requests():
    """The output thread alone (no core, no process): an unencodable result fails its requests,
    and the core is told to drop the unfinished ones; a heartbeat crosses as an empty frame."""
    addr = "inproc://outputs"
    proc = EngineCoreProc(None, "inproc://unused", addr, heartbeat_s=None)
    sink = proc.ctx.socket(zmq.PULL)
    sink.bind(addr)
    thread = proc.threads[1]  # the output thread
    thread.start()
    try:
        outs = [EngineCoreOutput("a", [7]), EngineCoreOutput("b", [8], finish_reason="stop")]
        proc.outputs.put(EngineCoreOutputs(outs, step_stats=_Unsendable()))
        assert sink.poll(int(DEADLINE_S * 1000))
        sent = MessageCodec().decode(sink.recv(), EngineCoreOutputs)
        assert [(o.request_id, o.finish_reason) for o in sent.outputs] == [("a", "error"),
                                                                            ("b", "error")]
        assert "could not send a result: TypeError" in sent.error
        kind, abort = proc.inputs.get(timeout=DEADLINE_S)
        assert abort.request_ids == ["a"]  # "b" had finished
        proc._heartbeat_due()
        assert sink.poll(int(DEADLINE_S * 1000)) and is_heartbeat(sink.recv())
    finally:
        proc.outputs.put(None)
        thread.join(DEADLINE_S)
        sink.close(linger=0)
        proc.ctx.term()
