"""EngineCoreProc: the engine core in its own process (`engine_client=mp`), vLLM V1's shape.

    frontend (MPClient)                        core process (this module)
    PUSH  --ADD/ABORT/UTILITY/SHUTDOWN-->  PULL  input thread: decode -> inputs queue
                                               busy loop: drain inputs (block when idle),
                                                          step, queue the step's result
    PULL  <--EngineCoreOutputs (msgpack)-- PUSH output thread: encode + send
                 <--HEARTBEAT (empty frame)---  heartbeat thread: one every heartbeat_s

The IO threads move messages between the ZMQ sockets and in-process queues, so decoding and
encoding overlap the step (pyzmq and msgspec release the GIL while they copy). The heartbeat
thread queues a HEARTBEAT for the output thread every `heartbeat_s` whatever the busy loop does
(a long step included), so the frontend hears from a working core at least that often and takes
silence for a stopped or wedged process (MPClient, knob `core_timeout_s`).

An IO thread never dies silently (a dead input thread would leave every later request waiting
on a process that still lives). An ADD frame that does not decode fails its own request when its
id can be read (the same refusal as a request the core refuses), and the core serves on; an
output that does not encode fails the requests it carries. Anything else that goes wrong in an
IO thread (a frame naming no request, an unknown kind, an exception of the thread's own) is
logged with its traceback and ends the process with exit code EXIT_FAULT, which the frontend
reports as EngineDeadError.

A step that raises fails its requests (EngineCore's rules) and the failure travels as an
EngineCoreOutputs with `error` set; the loop serves on. A UTILITY frame runs one of
`EngineCore.UTILITIES` between steps (e.g. "status": requests and KV blocks in use) and sends
its result as an EngineCoreOutputs with `utility` set. The process ignores SIGINT (Ctrl-C is
the frontend's to handle: it aborts its requests), stops on SHUTDOWN, and exits at once when the
frontend's process is gone however it ended (watch_parent, removing the frontend's IPC
directory, which a killed frontend leaves behind); if the core dies, the frontend
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

from lab.config.validate import SETTING_ERRORS
from lab.core.protocol import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    UtilityCall,
    UtilityResult,
)
from lab.core.request import RequestStatus
from lab.distributed.launch import adopt_environ, watch_parent
from lab.engine.core import EngineCore
from lab.engine.serial import MessageCodec

ADD, ABORT, SHUTDOWN, UTILITY = b"\x00", b"\x01", b"\x02", b"\x03"
#: the core's "still here" on the output socket: an empty frame (no encoded message is empty),
#: which the clients count as hearing from the core and never decode
HEARTBEAT = b""
#: the core process's exit code when it stops on a fault (see the module docstring)
EXIT_FAULT = 70  # EX_SOFTWARE
_FATAL = "fatal"  # an inputs-queue kind of this process only: an IO thread failed
_BEAT = object()  # in the outputs queue: send a HEARTBEAT

log = logging.getLogger(__name__)


def is_heartbeat(frame) -> bool:
    """Whether an output frame is a HEARTBEAT (bytes or a buffer)."""
    return len(frame) == 0


@dataclass(frozen=True)
class AbortMessage:
    request_ids: list[str]
    status: int = int(RequestStatus.FINISHED_ABORTED)


class CoreFault(RuntimeError):
    """An IO thread of the core process failed in a way no single request can absorb: the
    process stops (exit code EXIT_FAULT) so that the frontend fails loudly."""


def refusal(request_id: str, reason: str) -> EngineCoreOutputs:
    """The output that fails one request the core could not take (reason error): a refused
    add, or an ADD frame whose fields do not decode."""
    return EngineCoreOutputs([EngineCoreOutput(request_id, [], finish_reason="error")],
                             error=f"request {request_id!r} refused: {reason}")


def report(ready, message: tuple) -> bool:
    """Send the start-up result to the frontend; False when it is no longer listening (it
    stopped or died while this process started: nothing to serve, and no traceback to print
    into the output we share with it)."""
    try:
        ready.send(message)
    except (BrokenPipeError, ConnectionResetError):
        return False
    return True


def start_error(name: str, message: str, trace: str) -> Exception:
    """What a core process's failed start raises in its frontend (`name`, `message`: the core's
    exception; `trace`: its traceback): a refused setting (lab.config.validate.SETTING_ERRORS:
    a ValueError, a FileNotFoundError, omegaconf's MissingMandatoryValue) as the same type with
    the core's message first, so run.py and lab serve report it in one line as they do an
    in-process engine's; anything else a RuntimeError. The core's traceback follows the
    message."""
    refusals = {cls.__name__: cls for cls in SETTING_ERRORS}
    text = f"{message}\n\nin the engine-core process:\n{trace}"
    if name in refusals:
        return refusals[name](text)
    return RuntimeError(f"the engine core could not start: {name}: {text}")


def run_engine_core(cfg: dict, input_addr: str, output_addr: str, ready,
                    heartbeat_s: float | None = None, env: dict[str, str] | None = None,
                    ipc_dir: str | None = None) -> None:
    """Process entry: build the core from the composed config, report ready (or the error)
    through the `ready` pipe, then serve until SHUTDOWN (heartbeats every `heartbeat_s`; None:
    none) and exit at once: code 0, or EXIT_FAULT after a fault. `env`: the frontend's
    environment variables (a fork server's child starts with the server's). `ipc_dir`: the
    directory the frontend made for the two sockets, removed here if the frontend dies."""
    adopt_environ(env or {})
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch_parent((ipc_dir,) if ipc_dir else ())  # from the start: a frontend gone while we build
    from lab.engine.builder import build_core, set_cpu_threads

    try:
        config = OmegaConf.create(cfg)
        set_cpu_threads(config.cpu_threads, config.engine_client)
        core, info = build_core(config)
    except BaseException as e:  # noqa: BLE001 - reported to the frontend, which raises it
        kind = next((c for c in SETTING_ERRORS if isinstance(e, c)), type(e))  # subclass: base
        report(ready, ("error", (kind.__name__, str(e), traceback.format_exc())))
        return
    if not report(ready, ("ready", info)):
        core.shutdown()
        return
    ready.close()
    code = 0
    try:
        EngineCoreProc(core, input_addr, output_addr, heartbeat_s).run()
    except CoreFault as e:  # its thread logged the traceback
        log.error("the engine core stops: %s", e)
        code = EXIT_FAULT
    except BaseException:  # noqa: BLE001 - the frontend sees the exit code
        log.exception("the engine core's busy loop failed")
        code = EXIT_FAULT
    finally:
        core.shutdown()  # the executor's rank processes / actors end with the core
    # After SHUTDOWN every output is sent (run() closed the sockets and terminated their
    # context); after a fault nothing more can be. Tearing
    # down the interpreter (torch's modules, the model) costs CPU time that the frontend's
    # shutdown(), which waits for this process, would wait through too: skip it.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class EngineCoreProc:
    """The busy loop and its IO threads (input, output, heartbeat) around one EngineCore."""

    def __init__(self, core: EngineCore, input_addr: str, output_addr: str,
                 heartbeat_s: float | None = None) -> None:
        self.core = core
        self.inputs: queue.Queue = queue.Queue()
        self.outputs: queue.Queue = queue.Queue()
        self.ctx = zmq.Context()
        self.threads = [
            threading.Thread(target=self._input_loop, args=(input_addr,), daemon=True),
            threading.Thread(target=self._output_loop, args=(output_addr,), daemon=True),
        ]
        if heartbeat_s is not None:
            self.threads.append(threading.Thread(target=self._heartbeat_loop,
                                                 args=(heartbeat_s,), daemon=True))
        self.stopping = False
        self._stopped = threading.Event()  # ends the heartbeats
        self._beat_queued = threading.Event()  # a heartbeat waits in `outputs`

    def run(self) -> None:
        for t in self.threads:
            t.start()
        try:
            while not self.stopping:
                self._drain(block=not self.core.has_unfinished_requests())
                if not self.stopping and self.core.has_unfinished_requests():
                    self._step()
        finally:
            self._stopped.set()
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
                self.outputs.put(refusal(payload.request_id, f"{type(e).__name__}: {e}"))
        elif kind == ABORT:
            outs = self.core.abort_requests(payload.request_ids, RequestStatus(payload.status))
            if outs:
                self.outputs.put(EngineCoreOutputs(outs))
        elif kind == UTILITY:
            self.outputs.put(EngineCoreOutputs([], utility=self._utility(payload)))
        elif kind == SHUTDOWN:
            self.stopping = True
        elif kind == _FATAL:
            raise CoreFault(payload)

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
    def _fail_loudly(self, thread: str, error: BaseException) -> None:
        """An IO thread cannot go on: log why (with the traceback) and stop the busy loop, which
        ends the process with EXIT_FAULT (see the module docstring)."""
        log.error("the engine core's %s thread failed", thread, exc_info=error)
        self.inputs.put((_FATAL, f"its {thread} thread failed: {type(error).__name__}: {error}"))

    def _input_loop(self, addr: str) -> None:
        sock = self.ctx.socket(zmq.PULL)
        sock.connect(addr)
        try:
            self._read_inputs(sock, _InputDecoder(self.outputs))
        except BaseException as e:  # noqa: BLE001 - never a silent dead thread
            self._fail_loudly("input", e)
        finally:
            sock.close(linger=0)

    def _read_inputs(self, sock: zmq.Socket, decoder: _InputDecoder) -> None:
        """Frames -> the inputs queue, until SHUTDOWN."""
        while True:
            message = decoder.decode(sock.recv_multipart())
            if message is None:  # refused where it was read
                continue
            self.inputs.put(message)
            if message[0] == SHUTDOWN:
                return

    def _output_loop(self, addr: str) -> None:
        codec = MessageCodec()
        sock = self.ctx.socket(zmq.PUSH)
        sock.connect(addr)
        try:
            while (result := self.outputs.get()) is not None:
                if result is _BEAT:
                    self._send_heartbeat(sock)
                elif (data := self._encode(codec, result)) is not None:
                    sock.send(data)
        except BaseException as e:  # noqa: BLE001 - never a silent dead thread
            self._fail_loudly("output", e)
        finally:
            sock.close(linger=1000)

    def _encode(self, codec: MessageCodec, result: EngineCoreOutputs) -> bytes | None:
        """`result` encoded. One that does not encode fails what it carries instead: its
        requests (which the core then drops) or its utility call; one that carries neither (a
        step's statistics alone) is dropped (None). A failure of that fallback raises."""
        try:
            return codec.encode(result)
        except Exception as e:  # noqa: BLE001 - the requests it carries fail; the core serves on
            log.exception("the engine core could not encode a result")
            return self._encode_failure(
                codec, result, f"the engine core could not send a result: {type(e).__name__}: {e}")

    def _encode_failure(self, codec: MessageCodec, result: EngineCoreOutputs,
                        reason: str) -> bytes | None:
        if result.utility is not None:
            return codec.encode(EngineCoreOutputs([], utility=UtilityResult(
                result.utility.call_id, error=reason)))
        if not result.outputs:
            return None
        live = [out.request_id for out in result.outputs if not out.finished]
        if live:  # the frontend hears of them no more: the core must not serve them on
            self.inputs.put((ABORT, AbortMessage(live, int(RequestStatus.FINISHED_ERROR))))
        failed = [EngineCoreOutput(out.request_id, [], finish_reason="error")
                  for out in result.outputs]
        return codec.encode(EngineCoreOutputs(failed, error=reason))

    def _send_heartbeat(self, sock: zmq.Socket) -> None:
        """Send one heartbeat; dropped when the frontend's queue is full (it is not reading:
        the many heartbeats already queued tell it the same)."""
        self._beat_queued.clear()
        try:
            sock.send(HEARTBEAT, zmq.NOBLOCK)
        except zmq.Again:
            pass

    def _heartbeat_loop(self, interval: float) -> None:
        """A heartbeat every `interval` s, from this thread of its own: a long step does not
        delay it, a stopped or wedged process (or output thread) silences it."""
        while not self._stopped.wait(interval):
            self._heartbeat_due()

    def _heartbeat_due(self) -> None:
        """Queue a heartbeat for the output thread, unless one waits there already (a frontend
        that does not read must not make the queue grow)."""
        if not self._beat_queued.is_set():
            self._beat_queued.set()
            self.outputs.put(_BEAT)


class _InputDecoder:
    """Frames from the frontend -> (kind, message) for the busy loop. An ADD frame that does not
    decode fails its request at once (a refusal put on `outputs`; decode returns None) when its
    request id can be read; any other frame that does not decode raises (the input thread then
    fails loudly). A utility call that does not decode gets its error, as a failed call does."""

    def __init__(self, outputs: queue.Queue) -> None:
        self.outputs = outputs
        self.codec = MessageCodec()
        self.abort_decoder = msgspec.msgpack.Decoder(AbortMessage)

    def decode(self, frames: list[bytes]):
        if len(frames) != 2:
            raise CoreFault(f"an input of {len(frames)} frames (expected 2: kind, message)")
        kind, data = frames
        if kind == ADD:
            return self._request(data)
        if kind == ABORT:
            return ABORT, self.abort_decoder.decode(data)
        if kind == UTILITY:
            return self._utility_call(data)
        if kind == SHUTDOWN:
            return SHUTDOWN, None
        raise CoreFault(f"an input of unknown kind {bytes(kind)!r}")

    def _request(self, data: bytes):
        try:
            return ADD, self.codec.decode(data, EngineCoreRequest)
        except Exception as e:
            request_id = self.codec.request_id_of(data)
            if request_id is None:
                raise CoreFault(f"an ADD frame that names no request does not decode: "
                                f"{type(e).__name__}: {e}") from e
            log.warning("request %r does not decode: %s: %s", request_id, type(e).__name__, e)
            self.outputs.put(refusal(request_id, f"it does not decode: {type(e).__name__}: {e}"))
            return None

    def _utility_call(self, data: bytes):
        try:
            return UTILITY, self.codec.decode(data, UtilityCall)
        except Exception as e:
            call_id = self.codec.call_id_of(data)
            if call_id is None:
                raise CoreFault(f"a UTILITY frame that names no call does not decode: "
                                f"{type(e).__name__}: {e}") from e
            self.outputs.put(EngineCoreOutputs([], utility=UtilityResult(
                call_id, error=f"the call does not decode: {type(e).__name__}: {e}")))
            return None
