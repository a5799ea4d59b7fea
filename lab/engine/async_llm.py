"""AsyncLLM: an LLMEngine behind asyncio, for servers (vLLM's AsyncLLM, one process).

    async_llm = AsyncLLM.from_config(compose_config(["model=tiny_llama", "logger=[]"]))
    async for out in async_llm.generate("Hello", SamplingParams(max_tokens=8), "req-0"):
        ...

One background thread steps the engine while it holds requests and sleeps on a
`threading.Event` when idle. The engine is not thread-safe: every access to it (add, abort, step,
tokenize) holds `self.lock`. Outputs reach each request's consumer through its own
`asyncio.Queue`, filled from the engine thread with `loop.call_soon_threadsafe`. A consumer that
stops (cancelled, generator closed, client gone) aborts its request: the abort is queued and run
on the engine thread, which frees the request's KV blocks before its next step. A step that raises
fails only the requests it touched (LLMEngine.step): their consumers get the exception; the
others go on. If the engine thread itself dies, `is_healthy` turns False and every consumer gets
`EngineDeadError`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from omegaconf import DictConfig

from lab.engine.core import EngineDeadError
from lab.engine.llm_engine import LLMEngine
from lab.engine.outputs import RequestOutput
from lab.metrics.base import StatLogger
from lab.sampling.params import SamplingParams, as_sampling_params

log = logging.getLogger(__name__)


class EngineStepError(RuntimeError):
    """The step that served this request raised; the request was failed (finish reason
    `error`), other requests are unaffected."""


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


class RequestStream:
    """The outputs of one request, as an async iterator; closing it early aborts the request."""

    def __init__(self, owner: AsyncLLM, request_id: str, stream: _Stream) -> None:
        self.owner, self.request_id, self._stream = owner, request_id, stream
        self.finished = False

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        try:
            while not self.finished:
                item = await self._stream.queue.get()
                if isinstance(item, BaseException):
                    self.finished = True
                    raise item
                if item.finished:
                    self.finished = True
                yield item
        finally:
            if not self.finished:  # the consumer stopped early: the request goes
                self.owner.abort(self.request_id)

    def abort(self) -> None:
        if not self.finished:
            self.finished = True
            self.owner.abort(self.request_id)


class AsyncLLM:
    """An LLMEngine stepped by one background thread; requests come and go from asyncio."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.lock = threading.Lock()  # every engine access
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}  # guarded by self.lock
        self._aborts: list[str] = []  # guarded by self._abort_lock; run on the engine thread
        self._abort_lock = threading.Lock()
        self._stopped = False
        self._dead: BaseException | None = None
        self._step_error: BaseException | None = None  # the last step's failure (engine thread)
        self._thread = threading.Thread(target=self._run, name="lab-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, cfg: DictConfig, loggers: list[StatLogger] | None = None) -> AsyncLLM:
        return cls(LLMEngine(cfg, loggers=loggers))

    # -- state ---------------------------------------------------------------------------------
    @property
    def is_healthy(self) -> bool:
        return self._dead is None and self._thread.is_alive()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def num_unfinished(self) -> int:
        with self.lock:
            return len(self._streams)

    # -- requests ------------------------------------------------------------------------------
    async def add_request(self, prompt: str | list[int], params: SamplingParams | dict | None,
                          request_id: str | None = None) -> RequestStream:
        """Validate and queue a request (a bad one raises ValueError / TypeError here, before
        any output); return the stream of its outputs, in the caller's output_kind."""
        if self._dead is not None or self._stopped:
            raise EngineDeadError("the engine is not running") from self._dead
        params = SamplingParams() if params is None else as_sampling_params(params)
        stream = _Stream(asyncio.get_running_loop())
        rid = await asyncio.to_thread(self._add, prompt, params, request_id, stream)
        self._wake.set()
        return RequestStream(self, rid, stream)

    def _add(self, prompt, params, request_id, stream: _Stream) -> str:
        with self.lock:
            rid = self.engine.add_request(prompt, params, request_id=request_id)
            self._streams[rid] = stream
            return rid

    async def generate(self, prompt: str | list[int], params: SamplingParams | dict | None = None,
                       request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Yield the request's RequestOutputs as its params' output_kind says; stopping the
        iteration early aborts the request."""
        stream = await self.add_request(prompt, params, request_id)
        async for out in stream:
            yield out

    def abort(self, request_id: str) -> None:
        """Abort a request (from any thread); runs on the engine thread, which frees its blocks
        before the next step. Its consumer gets nothing more."""
        with self._abort_lock:
            self._aborts.append(request_id)
        self._wake.set()

    async def tokenize(self, text: str) -> list[int]:
        return await asyncio.to_thread(self._locked, lambda: self.engine.tokenizer.encode(text))

    async def apply_chat_template(self, messages: list[dict]) -> list[int]:
        tok = self.engine.tokenizer
        if tok is None:
            raise ValueError("chat needs the model's tokenizer, and this model has none")
        return await asyncio.to_thread(self._locked,
                                       lambda: tok.apply_chat_template(messages, None, True))

    def _locked(self, fn):
        with self.lock:
            return fn()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine thread; unfinished requests are aborted, their consumers get
        EngineDeadError."""
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout)
        with self.lock:
            ids = list(self._streams)
            if ids and self._dead is None:
                self.engine.abort_request(ids)
            self._fail_all(EngineDeadError("the engine was shut down"))
        self.engine.shutdown()

    # -- the engine thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopped:
                self._wake.clear()
                self._do_aborts()
                with self.lock:
                    busy = self.engine.has_unfinished_requests()
                if not busy:
                    self._wake.wait()
                    continue
                self._step()
        except BaseException as e:  # noqa: BLE001 - reported through is_healthy and streams
            log.exception("the engine thread died")
            self._dead = e
            with self.lock:
                self._fail_all(EngineDeadError(f"the engine thread died: {e!r}"))

    def _do_aborts(self) -> None:
        with self._abort_lock:
            ids, self._aborts = self._aborts, []
        if not ids:
            return
        with self.lock:
            live = [i for i in ids if self._streams.pop(i, None) is not None]
            if live:
                self.engine.abort_request(live)

    def _step(self) -> None:
        with self.lock:
            try:
                outputs = self.engine.step()
            except Exception as e:  # the step's requests were failed; the next step reports them
                log.warning("engine step failed: %r", e)
                outputs, self._step_error = [], e
            for out in outputs:
                stream = self._streams.get(out.request_id)
                if stream is None:  # aborted, or another owner's
                    continue
                item: RequestOutput | BaseException = out
                if out.finished:
                    del self._streams[out.request_id]
                    if any(c.finish_reason == "error" for c in out.outputs):
                        item = EngineStepError(f"the engine step serving request "
                                               f"{out.request_id!r} failed: {self._step_error!r}")
                        item.__cause__ = self._step_error
                self._put(stream, item)

    def _fail_all(self, error: BaseException) -> None:
        """Hand `error` to every open stream (holding self.lock)."""
        for stream in self._streams.values():
            self._put(stream, error)
        self._streams.clear()

    @staticmethod
    def _put(stream: _Stream, item) -> None:
        try:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)
        except RuntimeError:  # the consumer's loop is closed: nobody listens
            pass
