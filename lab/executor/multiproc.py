"""`executor=multiproc`: one process per rank on this machine, rank 0 too (as vLLM's
MultiprocExecutor), so the engine's process stays light.

    engine process (this executor)                  rank r process (worker_main)
    PUSH ipc://.../in-r   --pickle(call)-->        PULL   Worker(config, r, init_method)
    PULL ipc://.../out    <--(rank, status, value)-- PUSH   runs getattr(worker, method)(...)

A call is pickled once and the same bytes are pushed to every rank. `execute_model` answers
from rank 0 only (the others return an empty output, nothing to send); `collective_rpc` from
every rank. `execute_model_async` (async scheduling) pushes step N+1 to the ranks while they
still run step N and reads its answer later: a rank runs its calls in order and rank 0's
answers come back in order, so answers are read oldest first (every other call first settles
the steps in flight: their answers come before its own). A rank that raises sends its error
and the executor stops the group (see lab/executor/distributed.py); a rank that dies is seen
by its process sentinel, checked every POLL_S while the executor waits, so the engine raises
within a fraction of a second naming it.

Ranks start through `mp_context(start_method)` (forkserver by default: torch and the model
code are imported once in the fork server, each rank is a fork of it) and meet in one
torch.distributed group at a TCP rendezvous on 127.0.0.1. No orphans: each rank watches the
process that started it and exits the moment it is gone (an engine killed with SIGKILL
included); `shutdown()` (the engine's, or the garbage collector's / interpreter exit's through
a weakref finalizer) asks the ranks to exit, then kills what lingers.

Inside an engine-core process (engine_client=mp, a daemonic process, which multiprocessing
forbids to have children because it would leave them behind when it is terminated) the ranks
are started with that rule lifted for the moment of the start: the ranks' own parent watch is
what keeps them from outliving it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import tempfile
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import zmq

from lab.config.worker import WorkerConfig
from lab.core.step import ModelRunnerOutput, SchedulerOutput
from lab.distributed.launch import (
    adopt_environ,
    mp_context,
    socket_tempdir,
    start_uninterrupted,
    started,
    tcp_init_method,
    watch_parent,
)
from lab.executor.base import call_worker
from lab.executor.distributed import (
    POLL_S,
    STARTUP_TIMEOUT_S,
    DistributedExecutor,
    RankFailedError,
    rank_failure,
)
from lab.executor.pipeline import InOrderSteps, StepFuture

SHUTDOWN = b"shutdown"


def worker_main(config: WorkerConfig, rank: int, init_method: str, input_addr: str,
                output_addr: str, env: dict[str, str], ipc_dir: str) -> None:
    """A rank's process: build its Worker, report ready (or the error), then run calls until
    SHUTDOWN; exit at once (skipping the interpreter's teardown) when done or orphaned, then
    removing `ipc_dir`, the directory the engine made for the sockets."""
    adopt_environ(env)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the engine's to handle
    watch_parent((ipc_dir,))
    ctx = zmq.Context()
    inputs, outputs = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    inputs.connect(input_addr)
    outputs.connect(output_addr)
    worker = _build_worker(config, rank, init_method, outputs)
    if worker is not None:
        _serve(worker, rank, inputs, outputs)
        worker.shutdown()
    inputs.close(linger=0)
    outputs.close(linger=2000)
    ctx.term()
    os._exit(0)


def _build_worker(config: WorkerConfig, rank: int, init_method: str, outputs):
    from lab.platform import usable_cpu_cores
    from lab.worker.worker import Worker

    try:  # on a CPU the ranks share this machine's cores
        threads = max(1, usable_cpu_cores() // config.parallel.world_size)
        worker = Worker(config, rank, init_method, cpu_threads=threads)
    except BaseException as e:  # noqa: BLE001 - reported to the executor, which raises it
        outputs.send(pickle.dumps((rank, "error", _describe(e))))
        return None
    outputs.send(pickle.dumps((rank, "ok", None)))
    return worker


def _serve(worker, rank: int, inputs, outputs) -> None:
    """Run (method, args, kwargs, reply_all) calls; rank 0 always answers, the others when the
    call wants every rank's result, and every rank when it raises."""
    while (message := inputs.recv()) != SHUTDOWN:
        method, args, kwargs, reply_all = pickle.loads(message)
        try:
            result = call_worker(worker, method, args, kwargs)
        except BaseException as e:  # noqa: BLE001 - reported; the executor stops the group
            outputs.send(pickle.dumps((rank, "error", _describe(e)), protocol=5))
            continue
        if reply_all or rank == 0:
            outputs.send(pickle.dumps((rank, "ok", result), protocol=5))


def encode_call(method: str | Callable, args: tuple, kwargs: dict | None, reply_all: bool) -> bytes:
    """One call as the bytes pushed to every rank (pickled once; `_serve` loads them)."""
    return pickle.dumps((method, args, kwargs or {}, reply_all), protocol=5)


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}\n{traceback.format_exc()}"


@contextlib.contextmanager
def children_allowed():
    """Let a daemonic process (an engine-core process) start the rank processes (see the
    module docstring: the ranks watch their parent, so none outlives it)."""
    me = multiprocessing.current_process()
    daemonic = me.daemon
    if daemonic:
        me.daemon = False
    try:
        yield
    finally:
        if daemonic:
            me.daemon = True


class RankProcesses:
    """The rank processes and the sockets to them; knows who is alive. Closed by `close()`."""

    def __init__(self, config: WorkerConfig, start_method: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="lab-ranks-", dir=socket_tempdir())
        self.ctx = zmq.Context()
        self.output = self.ctx.socket(zmq.PULL)
        self.output.bind(f"ipc://{self.dir}/out")
        self.inputs, self.procs = [], []
        ctx = mp_context(start_method)
        init_method = tcp_init_method()
        try:
            with children_allowed():
                for rank in range(config.parallel.world_size):
                    sock = self.ctx.socket(zmq.PUSH)
                    self.inputs.append(sock)
                    sock.bind(f"ipc://{self.dir}/in-{rank}")
                    proc = ctx.Process(
                        target=worker_main, name=f"lab-worker-{rank}", daemon=True,
                        args=(config, rank, init_method, f"ipc://{self.dir}/in-{rank}",
                              f"ipc://{self.dir}/out", dict(os.environ), self.dir))
                    self.procs.append(proc)
                    start_uninterrupted(proc)
        except BaseException:  # a start that failed, or Ctrl-C / SIGTERM: no rank left behind
            self.kill()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def send(self, payload: bytes) -> None:
        for sock in self.inputs:
            sock.send(payload)

    def dead_ranks(self, wait_s: float = 0.0) -> dict[int, str]:
        """{rank: "(pid P) died with exit code C"} of the ranks that ended (waiting up to
        `wait_s` for one to end)."""
        if wait_s > 0:
            multiprocessing.connection.wait([p.sentinel for p in self.procs], wait_s)
        return {r: f"(pid {p.pid}) died with exit code {p.exitcode}"
                for r, p in enumerate(self.procs) if not p.is_alive()}

    def receive(self, timeout_s: float) -> tuple[int, str, Any] | None:
        """The next (rank, status, value) message, or None after `timeout_s`."""
        if not self.output.poll(int(timeout_s * 1000)):
            return None
        return pickle.loads(self.output.recv())

    def close(self, grace_s: float = 5.0) -> None:
        """Ask every rank to exit, kill those still there after `grace_s`; idempotent."""
        for sock in self.inputs:
            with contextlib.suppress(zmq.ZMQError):
                sock.send(SHUTDOWN, flags=zmq.NOBLOCK)
        deadline = time.monotonic() + grace_s
        for proc in started(self.procs):
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        self.kill()

    def kill(self) -> None:
        """SIGKILL every rank still alive, then release the sockets (idempotent)."""
        for proc in started(self.procs):
            if proc.is_alive():
                proc.kill()
        for proc in started(self.procs):
            proc.join(timeout=5)
        for sock in [*self.inputs, self.output]:
            sock.close(linger=0)
        self.inputs, self.procs = [], []
        self.ctx.term()
        shutil.rmtree(self.dir, ignore_errors=True)


class MultiprocExecutor(DistributedExecutor):
    """One worker process per rank on this machine (see the module docstring)."""

    def __init__(self, config: WorkerConfig, start_method: str = "forkserver",
                 startup_timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        self.world_size = config.parallel.world_size
        self.ranks = RankProcesses(config, start_method)
        self._finalizer = weakref.finalize(self, self.ranks.kill)
        self.failure: str | None = None
        self._in_flight = InOrderSteps(chain=False)  # steps sent, answers not read yet
        try:
            self._collect(set(range(self.world_size)), startup_timeout_s)  # every rank built
        except RankFailedError as e:
            if "died" not in str(e):
                raise
            raise RankFailedError(f"{e} while starting; a script that starts an engine with "
                                  "executor=multiproc must do so under `if __name__ == "
                                  "'__main__':` (ranks re-import the main module)") from None

    @property
    def pids(self) -> list[int]:
        """The rank processes' pids, in rank order."""
        return self.ranks.pids

    def collective_rpc(
        self, method: str | Callable, args: tuple = (), kwargs: dict | None = None,
    ) -> list[Any]:
        self._in_flight.drain()
        self._send(method, args, kwargs, reply_all=True)
        results = self._collect(set(range(self.world_size)))
        return [results[r] for r in range(self.world_size)]

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        self._in_flight.drain()
        self._send("execute_model", (sched,), None, reply_all=False)
        return self._collect({0})[0]

    def execute_model_async(self, sched: SchedulerOutput, chained: bool = False) -> StepFuture:
        """Push the step to the ranks now; its answer is read when asked for. (`chained` needs
        nothing here: after a failure the group is stopped and every later step raises.)"""
        self._send("execute_model", (sched,), None, reply_all=False)
        return self._in_flight.submit(lambda: self._collect({0})[0])

    def _send(self, method: str, args: tuple, kwargs: dict | None, reply_all: bool) -> None:
        if self.failure is not None:
            raise RankFailedError(self.failure)
        self.ranks.send(encode_call(method, args, kwargs, reply_all))

    def _collect(self, ranks: set[int], timeout_s: float | None = None) -> dict[int, Any]:
        """The answers of `ranks`, checking every POLL_S that every rank is alive; a rank's
        error or death stops the group and raises RankFailedError naming it."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        results: dict[int, Any] = {}
        while len(results) < len(ranks):
            message = self.ranks.receive(POLL_S)
            if message is not None:
                rank, status, value = message
                if status == "error":
                    self._fail(rank, value, self.ranks.dead_ranks(wait_s=0.5))
                results[rank] = value
            elif dead := self.ranks.dead_ranks():
                self._fail(min(dead), "", dead)
            elif deadline is not None and time.monotonic() > deadline:
                self._fail(min(ranks - set(results)), f"gave no answer in {timeout_s:.0f} s", {})
        return results

    def _fail(self, rank: int, what: str, dead: dict[int, str]) -> None:
        self.failure = rank_failure(rank, what, dead)
        self.ranks.kill()
        raise RankFailedError(self.failure)

    def shutdown(self) -> None:
        if self._finalizer.alive:
            self._finalizer.detach()
            self.ranks.close()
