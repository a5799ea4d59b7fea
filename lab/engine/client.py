"""MPClient: the frontend's handle on an engine core in its own process (`engine_client=mp`).

It offers what LLMEngine uses of an in-process EngineCore — add_request, abort_requests,
step, has_unfinished_requests, take_failed — over two ZMQ sockets (lab/engine/core_proc.py):
requests go out as they are added, and `step()` returns the core's next EngineCoreOutputs (the
core steps on its own while it has requests). Aborts are asynchronous: their final outputs come
with a later step(). A step that failed in the core raises EngineCoreError here after handing its
failed requests to take_failed(), like EngineCore.step. If the core process dies, every call
raises EngineDeadError naming it (checked at least every POLL_S while waiting), never hangs.
"""

from __future__ import annotations

import atexit
import multiprocessing
import shutil
import tempfile
import time

import msgspec
import zmq
from omegaconf import DictConfig, OmegaConf

from lab.engine.core import EngineDeadError
from lab.engine.core_proc import ABORT, ADD, SHUTDOWN, AbortMessage, run_engine_core
from lab.engine.protocol import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from lab.engine.request import RequestStatus
from lab.engine.serial import MessageCodec

POLL_S = 0.1  # how often a waiting call checks that the core process is alive
STARTUP_TIMEOUT_S = 900.0  # loading a big checkpoint takes a while


class EngineCoreError(RuntimeError):
    """A step raised inside the engine-core process (its requests were failed, reason error)."""


class MPClient:
    """Starts the core process, then talks to it (see the module docstring)."""

    def __init__(self, cfg: DictConfig) -> None:
        if cfg.executor.get("_target_", "").endswith("sim.SimExecutor"):
            raise ValueError("engine_client=mp runs the core on its own clock; executor=sim's "
                             "virtual clock needs engine_client=inproc")
        self._dir = tempfile.mkdtemp(prefix="lab-core-")
        input_addr, output_addr = f"ipc://{self._dir}/input", f"ipc://{self._dir}/output"
        self.ctx = zmq.Context()
        self.input = self.ctx.socket(zmq.PUSH)
        self.input.bind(input_addr)
        self.output = self.ctx.socket(zmq.PULL)
        self.output.bind(output_addr)
        self.codec = MessageCodec()
        self.abort_encoder = msgspec.msgpack.Encoder()
        spawn = multiprocessing.get_context("spawn")
        ready, child_end = spawn.Pipe(duplex=False)
        self.proc = spawn.Process(
            target=run_engine_core, name="lab-engine-core", daemon=True,
            args=(OmegaConf.to_container(cfg, resolve=False), input_addr, output_addr, child_end))
        self.proc.start()
        child_end.close()
        self.info = self._wait_ready(ready)
        self._live: set[str] = set()  # requests sent whose final output has not come back
        self._failed: list[EngineCoreOutput] = []
        self.dead: str | None = None
        self._closed = False
        atexit.register(self.shutdown)

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
        kind, payload = ready.recv()
        ready.close()
        if kind != "ready":
            self.shutdown()
            raise RuntimeError(f"the engine core could not start: {payload}")
        return payload

    # -- what LLMEngine calls ------------------------------------------------------------------
    def add_request(self, request: EngineCoreRequest) -> None:
        self._check_alive()
        self.input.send_multipart([ADD, self.codec.encode(request)])
        self._live.add(request.request_id)

    def abort_requests(
        self, request_ids: list[str], status: RequestStatus = RequestStatus.FINISHED_ABORTED,
    ) -> list[EngineCoreOutput]:
        """Ask the core to finish these requests; their final outputs come with a later
        step() (returns nothing now)."""
        self._check_alive()
        ids = [r for r in request_ids if r in self._live]
        if ids:
            message = AbortMessage(ids, int(status))
            self.input.send_multipart([ABORT, self.abort_encoder.encode(message)])
        return []

    def has_unfinished_requests(self) -> bool:
        return bool(self._live)

    def has_request(self, request_id: str) -> bool:
        """Whether a request of this id was sent and has not finished (as far as we know)."""
        return request_id in self._live

    def step(self) -> EngineCoreOutputs:
        """The core's next result (a step's, or an abort's); empty when nothing is live."""
        if not self._live:
            return EngineCoreOutputs([])
        while not self.output.poll(int(POLL_S * 1000)):
            self._check_alive()
        result = self.codec.decode(self.output.recv(), EngineCoreOutputs)
        for out in result.outputs:
            if out.finished:
                self._live.discard(out.request_id)
        if result.error is not None:
            self._failed.extend(result.outputs)
            raise EngineCoreError(f"the engine core's step failed: {result.error}")
        return result

    def take_failed(self) -> list[EngineCoreOutput]:
        failed, self._failed = self._failed, []
        return failed

    # -- lifecycle -----------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self.dead is None and not self.proc.is_alive():
            self.dead = (f"the engine-core process (pid {self.proc.pid}) died with exit code "
                         f"{self.proc.exitcode}")
            lost, self._live = sorted(self._live), set()
            self._failed.extend(EngineCoreOutput(r, [], finish_reason="error") for r in lost)
        if self.dead is not None:
            raise EngineDeadError(self.dead)

    def shutdown(self) -> None:
        """Stop the core process (SHUTDOWN, then terminate if it lingers) and clean up."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        try:
            if self.proc.is_alive():
                self.input.send_multipart([SHUTDOWN, b""], flags=zmq.NOBLOCK)
                self.proc.join(timeout=5)
            if self.proc.is_alive():
                self.proc.terminate()
                self.proc.join(timeout=5)
        except (zmq.ZMQError, AttributeError, ValueError):
            pass
        finally:
            for sock in (getattr(self, "input", None), getattr(self, "output", None)):
                if sock is not None:
                    sock.close(linger=0)
            self.ctx.term()
            shutil.rmtree(self._dir, ignore_errors=True)
