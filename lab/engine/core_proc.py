"""EngineCoreProc: the engine core in its own process (`engine_client=mp`), vLLM V1's shape.

    frontend (MPClient)                        core process (this module)
    PUSH  --ADD/ABORT/UTILITY/SHUTDOWN-->  PULL  input thread: decode -> inputs queue
                                               busy loop: drain inputs (block when idle),
                                                          step, queue the step's result
    PULL  <--EngineCoreOutputs (msgpack)-- PUSH output thread: encode + send

The IO threads move messages between the ZMQ sockets and in-process queues, so decoding and
encoding overlap the step (pyzmq and msgspec release the GIL while they copy). A step that
raises fails its requests (EngineCore's rules) and the failure travels as an
EngineCoreOutputs with `error` set; the loop serves on. A UTILITY frame runs one of
`EngineCore.UTILITIES` between steps (e.g. "status": requests and KV blocks in use) and sends
its result as an EngineCoreOutputs with `utility` set. The process ignores SIGINT (Ctrl-C is
the frontend's to handle: it aborts its requests), stops on SHUTDOWN, and exits at once when the
frontend's process is gone however it ended (watch_parent); if the core dies, the frontend
notices (MPClient) and fails its callers.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import sys
import threading
import traceback
from dataclasses import dataclass

import msgspec
import zmq
from omegaconf import OmegaConf

from lab.core.protocol import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    UtilityCall,
    UtilityResult,
)
from lab.core.request import RequestStatus
from lab.distributed.launch import watch_parent
from lab.engine.core import EngineCore
from lab.engine.serial import MessageCodec

ADD, ABORT, SHUTDOWN, UTILITY = b"\x00", b"\x01", b"\x02", b"\x03"


@dataclass(frozen=True)
class AbortMessage:
    request_ids: list[str]
    status: int = int(RequestStatus.FINISHED_ABORTED)


def run_engine_core(cfg: dict, input_addr: str, output_addr: str, ready) -> None:
    """Process entry: build the core from the composed config, report ready (or the error)
    through the `ready` pipe, then serve until SHUTDOWN and exit at once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from lab.engine.builder import build_core, set_cpu_threads

    try:
        config = OmegaConf.create(cfg)
        set_cpu_threads(config.cpu_threads, config.engine_client)
        core, info = build_core(config)
    except BaseException as e:  # noqa: BLE001 - reported to the frontend, which raises it
        ready.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        return
    ready.send(("ready", info))
    ready.close()
    watch_parent()
    try:
        EngineCoreProc(core, input_addr, output_addr).run()
    finally:
        core.shutdown()  # the executor's rank processes / actors end with the core
    # Every output is sent (run() closed the sockets and terminated their context). Tearing
    # down the interpreter (torch's modules, the model) costs CPU time that the frontend's
    # shutdown(), which waits for this process, would wait through too: skip it.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class EngineCoreProc:
    """The busy loop and its two IO threads around one EngineCore."""

    def __init__(self, core: EngineCore, input_addr: str, output_addr: str) -> None:
        self.core = core
        self.inputs: queue.Queue = queue.Queue()
        self.outputs: queue.Queue = queue.Queue()
        self.ctx = zmq.Context()
        self.threads = [
            threading.Thread(target=self._input_loop, args=(input_addr,), daemon=True),
            threading.Thread(target=self._output_loop, args=(output_addr,), daemon=True),
        ]
        self.stopping = False

    def run(self) -> None:
        for t in self.threads:
            t.start()
        while not self.stopping:
            self._drain(block=not self.core.has_unfinished_requests())
            if not self.stopping and self.core.has_unfinished_requests():
                self._step()
        self.outputs.put(None)
        self.threads[1].join(timeout=5)
        self.ctx.term()

    def _drain(self, block: bool) -> None:
        """Handle every queued input; wait for one first when there is nothing to step."""
        try:
            message = self.inputs.get(block=block)
        except queue.Empty:
            return
        while True:
            self._handle(message)
            try:
                message = self.inputs.get_nowait()
            except queue.Empty:
                return

    def _handle(self, message) -> None:
        kind, payload = message
        if kind == ADD:
            try:
                self.core.add_request(payload)
            except Exception as e:  # noqa: BLE001 - refuse this request, serve the others
                self.outputs.put(EngineCoreOutputs(
                    [EngineCoreOutput(payload.request_id, [], finish_reason="error")],
                    error=f"request {payload.request_id!r} refused: {type(e).__name__}: {e}"))
        elif kind == ABORT:
            outs = self.core.abort_requests(payload.request_ids, RequestStatus(payload.status))
            if outs:
                self.outputs.put(EngineCoreOutputs(outs))
        elif kind == UTILITY:
            self.outputs.put(EngineCoreOutputs([], utility=self._utility(payload)))
        elif kind == SHUTDOWN:
            self.stopping = True

    def _utility(self, call: UtilityCall) -> UtilityResult:
        try:
            return UtilityResult(call.call_id, self.core.call_utility(call.method, *call.args))
        except Exception as e:  # noqa: BLE001 - the caller gets the error, the core serves on
            return UtilityResult(call.call_id, error=f"{type(e).__name__}: {e}")

    def _step(self) -> None:
        try:
            result = self.core.step()
        except Exception as e:  # noqa: BLE001 - the step's requests failed; the loop serves on
            failed = self.core.take_failed()
            self.outputs.put(EngineCoreOutputs(failed, error=f"{type(e).__name__}: {e}"))
            return
        if result.outputs or result.step_stats is not None:  # async: a call may only submit
            self.outputs.put(result)

    # -- IO threads ----------------------------------------------------------------------------
    def _input_loop(self, addr: str) -> None:
        codec = MessageCodec()
        abort_decoder = msgspec.msgpack.Decoder(AbortMessage)
        sock = self.ctx.socket(zmq.PULL)
        sock.connect(addr)
        try:
            while True:
                kind, data = sock.recv_multipart()
                if kind == ADD:
                    self.inputs.put((ADD, codec.decode(data, EngineCoreRequest)))
                elif kind == ABORT:
                    self.inputs.put((ABORT, abort_decoder.decode(data)))
                elif kind == UTILITY:
                    self.inputs.put((UTILITY, codec.decode(data, UtilityCall)))
                else:
                    self.inputs.put((SHUTDOWN, None))
                    return
        finally:
            sock.close(linger=0)

    def _output_loop(self, addr: str) -> None:
        codec = MessageCodec()
        sock = self.ctx.socket(zmq.PUSH)
        sock.connect(addr)
        try:
            while (result := self.outputs.get()) is not None:
                sock.send(codec.encode(result))
        finally:
            sock.close(linger=1000)
