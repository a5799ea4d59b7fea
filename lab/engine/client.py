"""The frontend's handles on an engine core in its own process: MPClient (`engine_client=mp`,
synchronous, for LLM / LLMEngine) and AsyncMPClient (`engine_client=async_mp`, asyncio, for
AsyncLLM and `lab serve`).

MPClient offers what LLMEngine uses of an in-process EngineCore — add_request, abort_requests,
step, has_unfinished_requests, take_failed, call_utility — over two ZMQ sockets
(lab/engine/core_proc.py): requests go out as they are added, and `step()` returns the core's
next EngineCoreOutputs (the core steps on its own while it has requests). An abort returns
the requests' final outputs at once; the core's own (with their statistics) follow. A step that failed in the core
raises EngineCoreError here after handing its failed requests to take_failed(), like
EngineCore.step. If the core process dies, every call raises EngineDeadError naming it (checked
at least every POLL_S while waiting), never hangs. A core process that lives but says nothing for
`core_timeout_s` while a call waits on it (it sends a heartbeat every heartbeat_interval() s,
during steps too: lab/engine/core_proc.py) is stopped or hung: it is declared dead the same way,
and shutdown() kills it.

AsyncMPClient adds `await get_output_async()` (the next step result, for one output-handler
task) and `await call_utility_async(...)`, so a server's event loop waits on the core without a
thread; sending stays synchronous (a PUSH to a local socket does not block).
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import os
import shutil
import tempfile
import time
from collections import deque

import msgspec
import zmq
import zmq.asyncio
from omegaconf import DictConfig, OmegaConf

from lab.config.knobs import EngineKnobs
from lab.core.protocol import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    UtilityCall,
    UtilityResult,
)
from lab.core.request import FINISH_REASONS, RequestStatus
from lab.distributed.launch import mp_context, socket_tempdir, start_uninterrupted
from lab.engine.core import EngineCore, EngineDeadError
from lab.engine.core_proc import (
    ABORT,
    ADD,
    EXIT_FAULT,
    SHUTDOWN,
    UTILITY,
    AbortMessage,
    is_heartbeat,
    run_engine_core,
    start_error,
)
from lab.engine.serial import MessageCodec

POLL_S = 0.1  # how often a waiting call checks that the core process is alive
STARTUP_TIMEOUT_S = 900.0  # loading a big checkpoint takes a while


def heartbeat_interval(timeout_s: float | None) -> float | None:
    """How often the core process sends a heartbeat when the frontend declares it dead after
    `timeout_s` of silence: four times per timeout (a late heartbeat or two is no death), and
    at least once a second (None: no timeout, no heartbeats)."""
    return None if timeout_s is None else min(1.0, timeout_s / 4)


def exit_description(code: int | None) -> str:
    """The core process's exit code, and what lab's own code means."""
    if code == EXIT_FAULT:
        return f"exit code {code}: it stopped on a fault, logged there with its traceback"
    return f"exit code {code}"


class EngineCoreError(RuntimeError):
    """A step raised inside the engine-core process (its requests were failed, reason error),
    or a utility call failed there."""


class MPClient:
    """Starts the core process, then talks to it (see the module docstring)."""

    def __init__(self, cfg: DictConfig) -> None:
        if cfg.executor.get("_target_", "").endswith("sim.SimExecutor"):
            raise ValueError("engine_client=mp runs the core on its own clock; executor=sim's "
                             "virtual clock needs engine_client=inproc")
        self.codec = MessageCodec()
        self.abort_encoder = msgspec.msgpack.Encoder()
        self.timeout_s = EngineKnobs.of(cfg).core_timeout_s
        self._dir: str | None = None
        try:
            self._dir = tempfile.mkdtemp(prefix="lab-core-", dir=socket_tempdir())
            self.info = self._start(cfg)
        except BaseException:  # e.g. Ctrl-C / SIGTERM while the core starts: leave nothing
            self.shutdown()
            raise
        self._heard = time.monotonic()  # when a frame of the core's last came
        self._live: set[str] = set()  # requests sent whose final output has not come back
        self._failed: list[EngineCoreOutput] = []
        self._early: deque[EngineCoreOutputs] = deque()  # step results read by call_utility
        self._call_ids = itertools.count()
        self.dead: str | None = None
        self._closed = False
        atexit.register(self.shutdown)

    def _start(self, cfg: DictConfig):
        """Bind the two sockets in our IPC directory, start the core process (a fork of
        the fork server, lab.distributed.launch) and wait for its
        CoreInfo."""
        input_addr, output_addr = f"ipc://{self._dir}/input", f"ipc://{self._dir}/output"
        self.ctx = zmq.Context()
        self.input = self.ctx.socket(zmq.PUSH)
        self.input.bind(input_addr)
        self.output = self.ctx.socket(zmq.PULL)
        self.output.bind(output_addr)
        ctx = mp_context("forkserver")  # a fork of the server that imported torch and lab once
        ready, child_end = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(
            target=run_engine_core, name="lab-engine-core", daemon=True,
            args=(OmegaConf.to_container(cfg, resolve=False), input_addr, output_addr, child_end,
                  heartbeat_interval(self.timeout_s), dict(os.environ), self._dir))
        start_uninterrupted(self.proc)  # a stop signal now finds self.proc stoppable
        child_end.close()
        return self._wait_ready(ready)

    def _wait_ready(self, ready):
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not ready.poll(POLL_S):
            if not self.proc.is_alive():
                self.shutdown()
                raise EngineDeadError(f"the engine-core process died while starting (exit code "
                                      f"{self.proc.exitcode})")
            if time.monotonic() > deadline:
                self.shutdown()
                raise EngineDeadError(f"the engine-core process was not ready after "
                                      f"{STARTUP_TIMEOUT_S:.0f} s")
        try:
            kind, payload = ready.recv()
        except EOFError:  # the child closed the pipe without a word: it failed to start
            self.proc.join(timeout=5)
            self.shutdown()
            raise EngineDeadError(
                f"the engine-core process exited while starting (exit code {self.proc.exitcode})"
                "; a script that starts an engine with engine_client=mp / async_mp must do so "
                "under `if __name__ == '__main__':` (the core process, a fork of multiprocessing's "
                "fork server, re-imports the main module)") from None
        ready.close()
        if kind != "ready":
            self.shutdown()
            raise start_error(*payload)
        return payload

    # -- what LLMEngine calls ------------------------------------------------------------------
    def add_request(self, request: EngineCoreRequest) -> None:
        self._check_alive()
        self._send([ADD, self.codec.encode(request)])
        self._live.add(request.request_id)

    def abort_requests(
        self, request_ids: list[str], status: RequestStatus = RequestStatus.FINISHED_ABORTED,
    ) -> list[EngineCoreOutput]:
        """Ask the core to finish these requests and return their final outputs now, as an
        in-process core does (vLLM's frontend, too, ends an aborted request at once): no token
        the core computes meanwhile reaches the caller. The core's own final output follows
        with a later step() and carries the request's statistics; the id stays in use until
        it came."""
        self._check_alive()
        ids = [r for r in request_ids if r in self._live]
        if ids:
            message = AbortMessage(ids, int(status))
            self._send([ABORT, self.abort_encoder.encode(message)])
        return [EngineCoreOutput(r, [], finish_reason=FINISH_REASONS[status]) for r in ids]

    def has_unfinished_requests(self) -> bool:
        return bool(self._live)

    def has_request(self, request_id: str) -> bool:
        """Whether a request of this id was sent and has not finished (as far as we know)."""
        return request_id in self._live

    def step(self) -> EngineCoreOutputs:
        """The core's next result (a step's, or an abort's); empty when nothing is live."""
        if self._early:
            result = self._early.popleft()
        elif not self._live:
            return EngineCoreOutputs([])
        else:
            result = self._recv()
        if result.error is not None:
            self._failed.extend(result.outputs)
            raise EngineCoreError(f"the engine core's step failed: {result.error}")
        return result

    def call_utility(self, method: str, *args):
        """Run `EngineCore.<method>(*args)` in the core process (one of EngineCore.UTILITIES)
        and return its result; step results that arrive meanwhile wait for step()."""
        call_id = self._send_utility(method, args)
        while True:
            result = self._recv()
            if result.utility is None:
                self._early.append(result)
            elif result.utility.call_id == call_id:
                return self._utility_value(method, result.utility)

    def _send_utility(self, method: str, args) -> int:
        if method not in EngineCore.UTILITIES:  # refused here, before it crosses
            raise ValueError(f"utility {method!r} is not one of {sorted(EngineCore.UTILITIES)}")
        self._check_alive()
        call_id = next(self._call_ids)
        self._send([UTILITY, self.codec.encode(UtilityCall(call_id, method, list(args)))])
        return call_id

    @staticmethod
    def _utility_value(method: str, answer: UtilityResult):
        if answer.error is not None:
            raise EngineCoreError(f"utility {method!r} failed in the engine core: "
                                  f"{answer.error}")
        return msgspec.convert(answer.result, EngineCore.UTILITIES[method])

    def _send(self, frames: list[bytes]) -> None:
        """Send to the core, never blocking for good: a PUSH waits while no core is connected
        (its input thread ended a moment before the process does), so wait at most POLL_S at a
        time while the process lives, and declare it dead once it took nothing for
        core_timeout_s."""
        start = time.monotonic()
        while True:
            try:
                self.input.send_multipart(frames, flags=zmq.NOBLOCK)
                return
            except zmq.Again:
                self._check_alive()
            waited = time.monotonic() - start
            if self.timeout_s is not None and waited > self.timeout_s:
                self._declare_dead(f"the engine core (pid {self.proc.pid}) has taken no input "
                                   f"for {waited:.1f} s (core_timeout_s={self.timeout_s:g})")
                raise EngineDeadError(self.dead)
            self.input.poll(int(POLL_S * 1000), zmq.POLLOUT)

    def _recv(self) -> EngineCoreOutputs:
        """The core's next message (waiting, checking that the core lives every POLL_S)."""
        while True:
            while not self.output.poll(int(POLL_S * 1000)):
                self._check_alive(waiting=True)
            data = self.output.recv()
            if self._heard_from(data):
                return self._track(self.codec.decode(data, EngineCoreOutputs))

    def _heard_from(self, data) -> bool:
        """Note that the core spoke; whether `data` is a message (not a heartbeat, which no
        consumer sees)."""
        self._heard = time.monotonic()
        return not is_heartbeat(data)

    def _track(self, result: EngineCoreOutputs) -> EngineCoreOutputs:
        for out in result.outputs:
            if out.finished:
                self._live.discard(out.request_id)
        return result

    def take_failed(self) -> list[EngineCoreOutput]:
        failed, self._failed = self._failed, []
        return failed

    # -- lifecycle -----------------------------------------------------------------------------
    def _check_alive(self, waiting: bool = False) -> None:
        """Raise EngineDeadError if the core process died, or (`waiting`: called by a wait that
        has just found nothing to read, so every frame that came was read) if it has been
        silent for longer than core_timeout_s. Only a wait judges silence: between calls nobody
        reads, and the heartbeats that queue up meanwhile are read before the next judgement."""
        if self.dead is None and not self.proc.is_alive():
            self._declare_dead(f"the engine-core process (pid {self.proc.pid}) died with "
                               f"{exit_description(self.proc.exitcode)}")
        elif self.dead is None and waiting and self.timeout_s is not None:
            silent = time.monotonic() - self._heard
            if silent > self.timeout_s:
                self._declare_dead(
                    f"the engine core (pid {self.proc.pid}) has not answered for {silent:.1f} s: "
                    f"stopped or hung (core_timeout_s={self.timeout_s:g})")
        if self.dead is not None:
            raise EngineDeadError(self.dead)

    def _declare_dead(self, reason: str) -> None:
        """No more answers will come: every request in flight fails (take_failed)."""
        self.dead = reason
        lost, self._live = sorted(self._live), set()
        self._failed.extend(EngineCoreOutput(r, [], finish_reason="error") for r in lost)

    def shutdown(self) -> None:
        """Stop the core process and clean up: SHUTDOWN, then SIGTERM if it lingers, then
        SIGKILL (a stopped process ignores SIGTERM until it is continued). A core still starting
        is terminated at once, one declared hung killed at once."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        hung = getattr(self, "dead", None) is not None  # (unset while the core was starting)
        serving = getattr(self, "info", None) is not None  # (a starting core reads no input)
        try:
            if self.proc.is_alive() and serving and not hung:
                self.input.send_multipart([SHUTDOWN, b""], flags=zmq.NOBLOCK)
                self.proc.join(timeout=5)
            if self.proc.is_alive() and not hung:
                self.proc.terminate()
                self.proc.join(timeout=5)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(timeout=5)
        except (zmq.ZMQError, AttributeError, ValueError):
            pass
        finally:
            if getattr(self, "ctx", None) is not None:
                close_context(self.ctx)
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)


def close_context(ctx: zmq.Context) -> None:
    """Close every socket `ctx` made, unsent frames dropped, then terminate it: also a socket a
    signal interrupted before the client kept it (SIGTERM while the core starts), which
    close-then-term would wait on forever (zmq_ctx_term waits for every socket to close)."""
    ctx.destroy(linger=0)


class AsyncMPClient(MPClient):
    """MPClient plus asyncio waits on the output socket (see the module docstring). Use the
    async methods from one event loop; `get_output_async` from one task only."""

    def __init__(self, cfg: DictConfig) -> None:
        super().__init__(cfg)
        self._aoutput = zmq.asyncio.Socket.shadow(self.output.underlying)
        self._calls: dict[int, asyncio.Future] = {}
        # the pending receive (kept across timeouts); not `_recv`, which would hide MPClient's
        # synchronous receive (step, call_utility: a warm-up before the event loop runs)
        self._pending_recv: asyncio.Future | None = None

    async def get_output_async(self) -> EngineCoreOutputs:
        """The core's next step (or abort) result, as it comes; a failed step's result has
        `error` set and its failed requests as outputs. Answers utility calls on the way.
        Raises EngineDeadError (failing the pending utility calls too) if the core dies."""
        while True:
            try:
                data = await self._next_message()
            except EngineDeadError as e:
                for future in self._calls.values():
                    if not future.done():
                        future.set_exception(EngineDeadError(str(e)))
                self._calls.clear()
                raise
            result = self._track(self.codec.decode(data, EngineCoreOutputs))
            if result.utility is None:
                return result
            future = self._calls.pop(result.utility.call_id, None)
            if future is not None and not future.done():
                future.set_result(result.utility)

    async def _next_message(self) -> bytes:
        """The next message from the core (heartbeats noted and skipped); one receive stays
        pending across the POLL_S checks that the core lives (a cancelled caller leaves it for
        the next call)."""
        pending = self._pending_recv
        if pending is not None and pending.get_loop() is not asyncio.get_running_loop():
            try:  # left pending by a loop that is gone: never let it take a message
                pending.cancel()
            except RuntimeError:
                pass
            self._pending_recv = None
        while True:
            if self._pending_recv is None:
                self._pending_recv = asyncio.ensure_future(self._aoutput.recv(copy=False))
            done, _ = await asyncio.wait({self._pending_recv}, timeout=POLL_S)
            if not done:
                self._check_alive(waiting=True)
                continue
            frame, self._pending_recv = self._pending_recv.result(), None
            if self._heard_from(frame.buffer):
                return frame.buffer

    async def call_utility_async(self, method: str, *args):
        """`call_utility` for the event loop: the answer comes through get_output_async, which
        a task of the caller's must be running."""
        future = asyncio.get_running_loop().create_future()
        call_id = self._send_utility(method, args)
        self._calls[call_id] = future
        return self._utility_value(method, await future)
