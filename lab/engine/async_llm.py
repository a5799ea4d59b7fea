"""AsyncLLM: an LLMEngine behind asyncio, for servers (vLLM's AsyncLLM).

    async_llm = AsyncLLM.from_config(compose_config(["model=tiny_llama", "logger=[]",
                                                     "engine_client=async_mp"]))
    async for out in async_llm.generate("Hello", SamplingParams(max_tokens=8), "req-0"):
        ...

The frontend (Processor, OutputProcessor, parallel sampling: the LLMEngine) always runs in this
process; the engine core runs where `engine_client` says, and a driver moves its results:

- `async_mp` (lab serve's default): the core steps in its own process
  (lab/engine/core_proc.py). One output-handler task on the event loop awaits each step's result
  (AsyncMPClient.get_output_async), turns it into RequestOutputs and hands them to the request
  streams; adds and aborts run on the loop too. No thread, no lock: the HTTP server, the
  detokenizer and the model step run in parallel on two processes.
- `inproc` (and the synchronous `mp` client): one background thread steps the engine while it
  holds requests and sleeps on a `threading.Event` when idle. The engine is not thread-safe:
  every access to it (add, abort, step) holds the driver's lock.

Tokenizing a prompt and rendering a chat template (`tokenize`, `render_chat`,
`apply_chat_template`) take long for a long prompt, and on the event loop they would stall
every other request (async_mp's handler, /health). They run on a thread of AsyncLLM's own (one
worker, started at the first call, stopped by `shutdown`), outside the driver's lock: they read
only the tokenizer, never the engine. The engine reads that tokenizer meanwhile (its
detokenizer: on the loop with async_mp, on the engine thread with inproc); concurrent reads of
an HF tokenizer are safe (lab/frontend/tokenizer.py), so neither waits for the other — as in
vLLM, whose server tokenizes on a one-thread executor while its output handler detokenizes.

Outputs reach each request's consumer through its own `asyncio.Queue`. A consumer that stops
(cancelled, generator closed, client gone) aborts its request; the core frees its KV blocks
before its next step. A step that raises fails only the requests it touched: their consumers get
EngineStepError; the others go on. If the engine thread or the core process dies, `is_healthy`
turns False and every consumer gets EngineDeadError (the core's death is noticed within
POLL_S; a core process that is stopped or hung, within `core_timeout_s`: lab/engine/client.py).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from lab.core.protocol import CoreStatus
from lab.core.sampling_params import RequestOutputKind, SamplingParams, as_sampling_params
from lab.engine.core import EngineDeadError
from lab.engine.llm_engine import LLMEngine
from lab.frontend.outputs import RequestOutput
from lab.metrics.base import StatLogger

log = logging.getLogger(__name__)


class EngineStepError(RuntimeError):
    """The step that served this request raised; the request was failed (finish reason
    `error`), other requests are unaffected."""


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    # AsyncLLM.abort(id) was called (from any thread): only the final output is still delivered
    aborted: bool = False


class RequestStream:
    """The outputs of one request, as an async iterator; closing it early aborts the request
    (its own: once that request ended, e.g. by `AsyncLLM.abort`, a newer request may hold the
    id, and the stream leaves it alone).

    A consumer that falls behind gets what queued up as one output, as vLLM's
    RequestOutputCollector gives it: DELTA outputs merged (`RequestOutput.add_delta`),
    CUMULATIVE ones replaced by the newest; so a loaded server writes fewer, larger chunks
    instead of falling further behind."""

    def __init__(self, owner: AsyncLLM, request_id: str, stream: _Stream,
                 kind: RequestOutputKind = RequestOutputKind.CUMULATIVE) -> None:
        self.owner, self.request_id, self._stream = owner, request_id, stream
        self.kind = kind
        self.finished = False
        self._held: BaseException | None = None  # an error taken while merging: next

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        try:
            while not self.finished:
                item = self._next_ready() or await self._stream.queue.get()
                if isinstance(item, BaseException):
                    self.finished = True
                    raise item
                if self._stream.aborted and not item.finished:
                    continue  # computed before the abort reached the engine: not delivered
                item = self._catch_up(item)
                if item.finished:
                    self.finished = True
                yield item
        finally:
            if not self.finished:  # the consumer stopped early: the request goes
                self.owner._driver.abort(self.request_id, self._stream)

    def _next_ready(self):
        held, self._held = self._held, None
        return held

    def _catch_up(self, item: RequestOutput) -> RequestOutput:
        """Fold the outputs already queued behind `item` into it (see the class docstring)."""
        queue = self._stream.queue
        while not item.finished and not queue.empty():
            nxt = queue.get_nowait()
            if isinstance(nxt, BaseException):
                self._held = nxt
                break
            item = item.add_delta(nxt) if self.kind == RequestOutputKind.DELTA else nxt
        return item

    def abort(self) -> None:
        if not self.finished:
            self.finished = True
            self.owner._driver.abort(self.request_id, self._stream)


class AsyncLLM:
    """An LLMEngine whose requests come and go from asyncio (see the module docstring)."""

    def __init__(self, engine: LLMEngine) -> None:
        from lab.engine.client import AsyncMPClient

        self.engine = engine
        self._streams: dict[str, _Stream] = {}  # touched by the driver's side only
        self._stopped = False
        self._dead: BaseException | None = None
        driver = _LoopDriver if isinstance(engine.core, AsyncMPClient) else _ThreadDriver
        self._driver: _Driver = driver(self)
        # the tokenizer's thread (module docstring); the executor starts it at the first call
        self._tokenizer_pool = ThreadPoolExecutor(1, thread_name_prefix="lab-tokenizer")
        if engine.tokenizer is not None:
            engine.tokenizer.max_chars_per_token  # noqa: B018 - computed now, not on a request

    @classmethod
    def from_config(cls, cfg: DictConfig, loggers: list[StatLogger] | None = None) -> AsyncLLM:
        return cls(LLMEngine(cfg, loggers=loggers))

    # -- state ---------------------------------------------------------------------------------
    @property
    def is_healthy(self) -> bool:
        return self._dead is None and not self._stopped and self._driver.alive()

    def death_reason(self) -> str | None:
        """Why the engine no longer serves (None while it does)."""
        if self._dead is not None:
            return str(self._dead)
        if self._stopped:
            return "the engine was shut down"
        if not self._driver.alive():
            return "the engine's driver stopped (its core process or thread ended)"
        return None

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary size: token ids are in [0, vocab_size)."""
        return self.engine.processor.vocab_size

    @property
    def model_path(self) -> str:
        """The model's checkpoint directory (what the engine loaded its config from)."""
        return str(self.engine.hf_config.name_or_path)

    @property
    def max_logprobs(self) -> int:
        """The most logprobs a request may ask for per token (-1: no limit)."""
        return self.engine.processor.max_logprobs

    @property
    def stat_loggers(self) -> tuple[StatLogger, ...]:
        """The loggers the engine's step and request statistics go to."""
        return tuple(self.engine.loggers)

    def add_stat_logger(self, logger: StatLogger) -> None:
        """Send the engine's statistics to `logger` too, from its next step on (e.g. a server's
        Prometheus metrics). Safe while the engine runs: the list is replaced, not changed in
        place under a step that reads it."""
        self.engine.loggers = [*self.engine.loggers, logger]

    @property
    def event_loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop the engine's outputs are handled on (async_mp, once a request came; None
        for the thread driver): another thread reaches the engine through it, e.g.
        `asyncio.run_coroutine_threadsafe(async_llm.get_status(), async_llm.event_loop)`."""
        return getattr(self._driver, "loop", None)

    def num_unfinished(self) -> int:
        """Requests whose consumer still waits for outputs."""
        return len(self._streams)

    async def get_status(self) -> CoreStatus:
        """The core's requests and KV blocks in use (e.g. 0 blocks once every request ended)."""
        self._check_running()
        return await self._driver.core_status()

    async def start(self) -> None:
        """Start handling the core's messages on the running loop now rather than at the first
        request, so a core that dies before any request comes is noticed (a server calls this
        at startup)."""
        self._check_running()
        await self._driver.run(lambda: None)

    # -- requests ------------------------------------------------------------------------------
    async def add_request(self, prompt: str | list[int], params: SamplingParams | dict | None,
                          request_id: str | None = None) -> RequestStream:
        """Validate and queue a request (a bad one raises ValueError / TypeError here, before
        any output); return the stream of its outputs, in the caller's output_kind."""
        self._check_running()
        params = SamplingParams() if params is None else as_sampling_params(params)
        stream = _Stream(asyncio.get_running_loop())

        def add() -> str:
            rid = self.engine.add_request(prompt, params, request_id=request_id)
            self._streams[rid] = stream
            return rid

        return RequestStream(self, await self._driver.run(add), stream, params.output_kind)

    async def generate(self, prompt: str | list[int], params: SamplingParams | dict | None = None,
                       request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Yield the request's RequestOutputs as its params' output_kind says; stopping the
        iteration early aborts the request."""
        stream = await self.add_request(prompt, params, request_id)
        async for out in stream:
            yield out

    def abort(self, request_id: str) -> None:
        """Abort a request (from any thread): the driver's side ends it in the core, which frees
        its blocks before the next step; its consumer gets a final output, finish reason
        `abort`, and no token computed after this call (a step already running when it comes
        is not delivered)."""
        stream = self._streams.get(request_id)  # a read: safe from any thread
        if stream is not None:
            stream.aborted = True
        self._driver.abort(request_id)

    async def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The token ids of `text`, computed on the tokenizer's thread (module docstring);
        add_special_tokens=False for a rendered chat template, which has its own."""
        tok = self._tokenizer_for("text prompts need")
        return await self._on_tokenizer_thread(lambda: tok.encode(text, add_special_tokens))

    async def render_chat(self, messages: list[dict]) -> str:
        """The messages rendered with the model's chat template, as text (tokenize it with
        add_special_tokens=False), on the tokenizer's thread."""
        tok = self._tokenizer_for("chat needs")
        return await self._on_tokenizer_thread(lambda: tok.render_chat(messages, None, True))

    async def apply_chat_template(self, messages: list[dict]) -> list[int]:
        """The token ids of the messages under the model's chat template, on the tokenizer's
        thread."""
        tok = self._tokenizer_for("chat needs")
        return await self._on_tokenizer_thread(
            lambda: tok.apply_chat_template(messages, None, True))

    def _tokenizer_for(self, what: str):
        tok = self.engine.tokenizer
        if tok is None:
            raise ValueError(f"{what} the model's tokenizer, and this model has none")
        return tok

    async def _on_tokenizer_thread(self, fn: Callable[[], Any]) -> Any:
        """fn() on the tokenizer's thread, awaited without blocking the loop."""
        return await asyncio.wrap_future(self._submit_to_tokenizer(fn))

    def _submit_to_tokenizer(self, fn: Callable[[], Any]) -> Future:
        """Queue fn on the tokenizer's thread; a shut-down AsyncLLM refuses with
        EngineDeadError (the executor itself refuses once shutdown closed it)."""
        self._check_running()
        try:
            return self._tokenizer_pool.submit(fn)
        except RuntimeError:  # shut down between the check and the submit
            self._check_running()
            raise

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the tokenizer's thread (once it finished what it holds), the driver and the
        engine (its core process, if any); unfinished requests end, their consumers get
        EngineDeadError."""
        self._stopped = True
        self._tokenizer_pool.shutdown(wait=True)  # takes no more calls, ends the queued ones
        self._driver.stop(timeout)
        ids = list(self._streams)
        self._fail_all(EngineDeadError("the engine was shut down"))
        if ids and self._dead is None:
            try:
                self.engine.abort_request(ids)
            except EngineDeadError:
                pass
        self.engine.shutdown()

    # -- the driver's side: outputs to streams -------------------------------------------------
    def _check_running(self) -> None:
        if self._dead is not None or self._stopped:
            raise EngineDeadError(f"the engine is not running: {self._dead or 'shut down'}") \
                from self._dead

    def _abort_now(self, aborts: list[tuple[str, _Stream | None]]) -> None:
        """End these requests (on the driver's side). Each is (request id, the stream that
        aborts it, or None for AsyncLLM.abort). A stream that stops aborts only while it is
        still its id's (once its request ended, a newer one may hold the id) and hears nothing
        more. A request aborted by id gets its final output (finish reason `abort`) at once,
        as in vLLM, and nothing after it."""
        by_stream, by_id = [], []
        for rid, stream in aborts:
            mine = self._streams.get(rid)
            if mine is None or (stream is not None and mine is not stream):
                continue
            if stream is None:
                by_id.append(rid)
            else:
                del self._streams[rid]
                by_stream.append(rid)
        if not (by_stream or by_id) or self._dead is not None:
            return
        try:
            self.engine.abort_request(by_stream + by_id)
        except EngineDeadError:  # the driver notices and fails every stream
            return
        self.engine.take_outputs(set(by_stream))  # nobody listens
        self._dispatch(self.engine.take_outputs(set(by_id)), None)
    def _dispatch(self, outputs: list[RequestOutput], error: BaseException | None) -> None:
        """Hand each output to its request's stream; a request failed by a step gets
        EngineStepError (caused by `error`)."""
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:  # aborted, or another owner's
                continue
            item: RequestOutput | BaseException = out
            if out.finished:
                del self._streams[out.request_id]
                if any(c.finish_reason == "error" for c in out.outputs):
                    item = EngineStepError(f"the engine step serving request "
                                           f"{out.request_id!r} failed: {error!r}")
                    item.__cause__ = error
            self._driver.put(stream, item)

    def _die(self, error: BaseException) -> None:
        self._dead = error
        self._fail_all(error if isinstance(error, EngineDeadError)
                       else EngineDeadError(f"the engine died: {error!r}"))

    def _fail_all(self, error: BaseException) -> None:
        for stream in self._streams.values():
            self._driver.put(stream, error)
        self._streams.clear()


class _Driver:
    """Where the engine is touched from: runs adds / aborts / steps and delivers outputs."""

    def __init__(self, owner: AsyncLLM) -> None:
        self.owner, self.engine = owner, owner.engine

    async def run(self, fn: Callable[[], Any]) -> Any:
        raise NotImplementedError

    def abort(self, request_id: str, stream: _Stream | None = None) -> None:
        """AsyncLLM._abort_now([(request_id, stream)]) on the driver's side, from any
        thread."""
        raise NotImplementedError

    async def core_status(self) -> CoreStatus:
        raise NotImplementedError

    def put(self, stream: _Stream, item) -> None:
        """Deliver to a stream from a thread that is not its loop's."""
        try:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)
        except RuntimeError:  # the consumer's loop is closed: nobody listens
            pass

    def alive(self) -> bool:
        raise NotImplementedError

    def stop(self, timeout: float) -> None:
        raise NotImplementedError


class _ThreadDriver(_Driver):
    """One background thread steps the engine (inproc, or the synchronous mp client); every
    engine access holds `lock`."""

    def __init__(self, owner: AsyncLLM) -> None:
        super().__init__(owner)
        self.lock = threading.Lock()
        self._wake = threading.Event()
        # (request id, stream or None) to abort: guarded by _abort_lock; run on the engine thread
        self._aborts: list[tuple[str, _Stream | None]] = []
        self._abort_lock = threading.Lock()
        self._stopping = False
        self._step_error: BaseException | None = None  # the last step's failure
        self._thread = threading.Thread(target=self._loop, name="lab-engine", daemon=True)
        self._thread.start()

    async def run(self, fn):
        result = await asyncio.to_thread(self._locked, fn)
        self._wake.set()
        return result

    def _locked(self, fn):
        with self.lock:
            return fn()

    def abort(self, request_id: str, stream: _Stream | None = None) -> None:
        with self._abort_lock:
            self._aborts.append((request_id, stream))
        self._wake.set()

    async def core_status(self) -> CoreStatus:
        return await asyncio.to_thread(self._locked, self.engine.core_status)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        try:
            while not self._stopping:
                self._wake.clear()
                with self._abort_lock:
                    aborts, self._aborts = self._aborts, []
                with self.lock:
                    if aborts:
                        self.owner._abort_now(aborts)
                    busy = self.engine.has_unfinished_requests()
                if not busy:
                    self._wake.wait()
                    continue
                with self.lock:
                    self._step()
        except BaseException as e:  # noqa: BLE001 - reported through is_healthy and streams
            log.exception("the engine thread died")
            with self.lock:
                self.owner._die(EngineDeadError(f"the engine thread died: {e!r}"))

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except EngineDeadError:
            raise
        except Exception as e:  # the step's requests were failed; the next step reports them
            log.warning("engine step failed: %r", e)
            outputs, self._step_error = [], e
        self.owner._dispatch(outputs, self._step_error)


class _LoopDriver(_Driver):
    """The engine lives on the event loop (async_mp): one output-handler task awaits the core
    process's results; adds and aborts run on the loop as they come."""

    def __init__(self, owner: AsyncLLM) -> None:
        super().__init__(owner)
        self.core = owner.engine.core
        self.loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None

    def _ensure_started(self) -> None:
        """Start the output handler on the running loop (again, once a previous loop closed:
        asyncio.run one after another)."""
        loop = asyncio.get_running_loop()
        if self._task is not None and loop is not self.loop and self.loop.is_closed():
            self._task = None
        if self._task is None:
            self.loop = loop
            self._task = loop.create_task(self._handle_outputs(), name="lab-outputs")
        elif loop is not self.loop:
            raise RuntimeError("an async_mp AsyncLLM serves one event loop at a time: the one "
                               "that sent its first request is still open")

    async def run(self, fn):
        self._ensure_started()
        return fn()

    def abort(self, request_id: str, stream: _Stream | None = None) -> None:
        if self.loop is None or self.loop.is_closed():
            return
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self.owner._abort_now([(request_id, stream)])
        else:
            self.loop.call_soon_threadsafe(self.owner._abort_now, [(request_id, stream)])

    async def core_status(self) -> CoreStatus:
        self._ensure_started()
        return await self.core.call_utility_async("status")

    def put(self, stream: _Stream, item) -> None:
        if stream.loop is self.loop:  # called on the loop: no wake-up needed
            stream.queue.put_nowait(item)
        else:
            super().put(stream, item)

    def alive(self) -> bool:
        """The core process lives and answers (the client has not declared it dead: gone, or
        silent past core_timeout_s) and the handler has not died (cancelled with its closed
        loop is fine: the next request starts another)."""
        task = self._task
        return self.core.dead is None and self.core.proc.is_alive() and not (
            task is not None and task.done() and not task.cancelled())

    def stop(self, timeout: float) -> None:
        task, loop = self._task, self.loop
        if task is None or task.done() or loop is None or loop.is_closed():
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            task.cancel()
        else:
            loop.call_soon_threadsafe(task.cancel)

    async def _handle_outputs(self) -> None:
        """Core results -> RequestOutputs -> streams, until the core dies or we stop."""
        from lab.engine.client import EngineCoreError

        try:
            while True:
                result = await self.core.get_output_async()
                outputs = self.engine.take_pending() + self.engine.absorb(result)
                error = None if result.error is None else EngineCoreError(result.error)
                self.owner._dispatch(outputs, error)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - reported through is_healthy and streams
            if not isinstance(e, EngineDeadError):
                log.exception("the output handler died")
            self.owner._die(e)
