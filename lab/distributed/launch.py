"""Starting rank processes: a free rendezvous port, the start method, and `RankPool`.

`RankPool(world_size)` starts one process per rank, each joined to one process group
(`init_parallel_state`), and runs functions on every rank: `pool.run(fn, *args)` calls
`fn(state, *args)` on each rank and returns the per-rank results in rank order. The pool lives
until `close()` (or the end of a `with` block), so many collective checks share one group: what
the layer tests and the collective benchmark use. A rank that raises or dies makes `run` raise a
RuntimeError naming the rank, and the pool is then closed (no process left behind).

Processes start through a multiprocessing context (`start_method`, default "forkserver"): the
fork server imports torch, transformers and lab's engine and worker code once (PRELOAD) and
forks each rank, and each engine-core process (lab/engine/client.py), from that clean state, so
a process costs a fork instead of an interpreter start and those imports (~3 CPU-seconds), and
none inherits the parent's threads or CUDA context (what makes a plain fork unsafe). A forked
child starts with the environment the fork server started with: `adopt_environ` gives it its
parent's, as a spawned child would have. `start_uninterrupted` starts a child so that a stop
signal cannot leave it running unknown to its parent.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import tempfile
import threading
import traceback
from collections.abc import Callable
from typing import Any

START_METHODS = ("forkserver", "spawn", "fork")
#: what the fork server imports before it forks anything: one list for ranks and engine-core
#: processes alike, since a process has one fork server and its first start decides the imports.
#: transformers' config modules load its activations (and, in transformers 5, torch.distributed
#: and sympy) on first use: ~1 CPU-second a child would otherwise pay. The last entry freezes
#: what the others imported out of the children's garbage collections (its docstring)
PRELOAD = ["torch", "transformers.activations", "transformers.models.auto.configuration_auto",
           "lab.distributed.parallel_state", "lab.worker.worker", "lab.executor.multiproc",
           "lab.engine.builder", "lab.engine.core_proc", "lab.engine.fork_server_gc"]


def watch_parent(leftovers: tuple[str, ...] = ()) -> None:
    """End this process as soon as the process that started it is gone (killed, crashed, or
    stopped without shutting its children down): an engine-core process or a rank that nobody
    can reach must not linger. `leftovers`: directories the parent made for this process and
    named to it (its IPC sockets' mkdtemp), removed first: a parent that was killed never ran
    its cleanup."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        for path in leftovers:
            shutil.rmtree(path, ignore_errors=True)  # gone already after a normal shutdown
        os._exit(0)  # nothing to flush: the only reader of our outputs is gone

    threading.Thread(target=watch, name="lab-parent-watch", daemon=True).start()


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def start_uninterrupted(proc: multiprocessing.process.BaseProcess) -> None:
    """`proc.start()`, with SIGINT and SIGTERM that arrive meanwhile handled once it returned.
    A start waits for the fork server's reply (seconds while the server first imports torch);
    a KeyboardInterrupt raised there (Ctrl-C, or `lab serve`'s SIGTERM while loading) left the
    child forked but `proc` without its handle, so the parent's cleanup could not stop it: it
    built its engine unseen and died on the closed pipe. Python runs signal handlers in the
    main thread only, so elsewhere this is a plain start."""
    if threading.current_thread() is not threading.main_thread():
        proc.start()
        return
    held: list[int] = []
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    deferred = [s for s, h in previous.items() if h is not None]  # None: not set from Python
    for s in deferred:
        signal.signal(s, lambda signum, _frame: held.append(signum))
    try:
        proc.start()
    finally:
        for s in deferred:
            signal.signal(s, previous[s])
        if held:
            signal.raise_signal(held[0])  # now, to the handler the caller had


def started(procs: list[multiprocessing.process.BaseProcess]
            ) -> list[multiprocessing.process.BaseProcess]:
    """The processes of `procs` that started (a start can fail or be interrupted)."""
    return [p for p in procs if p.pid is not None]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (for the process group's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


#: a Unix socket's path holds at most 107 bytes (Linux's sun_path, 108 with the terminating NUL)
UNIX_SOCKET_PATH_MAX = 107
#: the longest socket path made under the temporary directory: the fork server's listener
#: (multiprocessing's pymp-XXXXXXXX/listener-XXXXXXXX); lab's IPC sockets are shorter
#: (lab-core-XXXXXXXX/output, lab-ranks-XXXXXXXX/in-N)
LONGEST_SOCKET_NAME = len("/pymp-12345678/listener-12345678")


def socket_tempdir() -> str:
    """The temporary directory, where the fork server and lab's engine-core and rank processes
    make their Unix sockets: a ValueError naming TMPDIR when it is too long for their paths,
    instead of `OSError: AF_UNIX path too long` from inside a process start (a pytest tmp_path
    under a long user name, or a deep build directory, reached that)."""
    tmp = tempfile.gettempdir()
    room = UNIX_SOCKET_PATH_MAX - LONGEST_SOCKET_NAME
    if len(os.fsencode(tmp)) > room:
        raise ValueError(f"TMPDIR={tmp} is {len(os.fsencode(tmp))} bytes long: the Unix sockets "
                         f"of lab's processes live there and need it at most {room} bytes long "
                         f"(a socket path holds {UNIX_SOCKET_PATH_MAX}); set TMPDIR to a shorter "
                         f"directory")
    return tmp


def tcp_init_method(host: str = "127.0.0.1", port: int | None = None) -> str:
    return f"tcp://{host}:{port or free_port(host)}"


def mp_context(start_method: str = "forkserver"):
    """The multiprocessing context ranks and engine-core processes start in (ValueError naming
    the allowed methods, or TMPDIR when it is too long for the fork server's socket)."""
    if start_method not in START_METHODS:
        raise ValueError(f"start_method={start_method!r}: use one of {', '.join(START_METHODS)}")
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        socket_tempdir()  # the fork server's listening socket, when this start starts it
        ctx.set_forkserver_preload(PRELOAD)
    return ctx


def adopt_environ(env: dict[str, str]) -> None:
    """Set the starting process's environment variables (`dict(os.environ)` when it started
    this one) in this process: a child of the fork server has the variables the fork server
    started with, not its parent's of now (e.g. OMP_NUM_THREADS or LAB_CACHE_DIR set since).
    Variables are set, none removed; modules the fork server preloaded read theirs already."""
    os.environ.update(env)


def _rank_main(config, rank: int, init_method: str, device: str, conn,
               env: dict[str, str]) -> None:
    """A pool rank: join the group, then run (fn, args) messages until None."""
    adopt_environ(env)
    from lab.distributed.parallel_state import destroy_parallel_state, init_parallel_state

    try:
        state = init_parallel_state(config, rank, init_method, device)
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        return
    conn.send(("ok", None))
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the parent is gone
            break
        if message is None:
            break
        fn, args = message
        try:
            conn.send(("ok", fn(state, *args)))
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    destroy_parallel_state(state)


class RankPool:
    """`world_size` processes in one process group that run functions on every rank."""

    def __init__(self, world_size: int, device: str = "cpu", start_method: str = "forkserver",
                 timeout_s: float = 120.0, tensor_parallel_size: int | None = None) -> None:
        from lab.distributed.config import ParallelConfig

        self.timeout_s = timeout_s
        config = ParallelConfig(tensor_parallel_size=tensor_parallel_size or world_size)
        if config.world_size != world_size:
            raise ValueError(f"world_size={world_size} != tensor_parallel_size "
                             f"{config.tensor_parallel_size}")
        ctx = mp_context(start_method)
        init_method = tcp_init_method()
        self.conns, self.procs = [], []
        try:
            for rank in range(world_size):
                parent, child = ctx.Pipe()
                self.conns.append(parent)
                proc = ctx.Process(target=_rank_main, name=f"lab-rank-{rank}", daemon=True,
                                   args=(config, rank, init_method, device, child,
                                         dict(os.environ)))
                self.procs.append(proc)
                start_uninterrupted(proc)
                child.close()
        except BaseException:  # a start that failed, or Ctrl-C: no rank left behind
            self.close()
            raise
        self._collect()  # every rank joined (or the error of the first that could not)

    def run(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """fn(state, *args) on every rank (fn importable by name); results in rank order."""
        for conn in self.conns:
            conn.send((fn, args))
        return self._collect()

    def _collect(self) -> list[Any]:
        results: list[Any] = [None] * len(self.conns)
        pending = dict(enumerate(self.conns))
        while pending:
            ready = multiprocessing.connection.wait(
                list(pending.values()) + [p.sentinel for p in self.procs], self.timeout_s)
            if not ready:
                self.close()
                raise RuntimeError(f"ranks {sorted(pending)} gave no answer in {self.timeout_s} s")
            for rank, conn in list(pending.items()):
                if conn in ready or conn.poll():
                    try:
                        status, value = conn.recv()
                    except EOFError:
                        status, value = "error", "the process ended without answering"
                    if status == "error":
                        self.close()
                        raise RuntimeError(f"rank {rank} failed: {value}")
                    results[rank] = value
                    del pending[rank]
            for rank, proc in enumerate(self.procs):
                if rank in pending and not proc.is_alive() and not self.conns[rank].poll():
                    code = proc.exitcode
                    self.close()
                    raise RuntimeError(f"rank {rank} (pid {proc.pid}) died (exit code {code})")
        return results

    def close(self) -> None:
        """Stop every rank (politely, then by force); idempotent."""
        for conn in self.conns:
            try:
                conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for proc in started(self.procs):
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for conn in self.conns:
            conn.close()
        self.conns, self.procs = [], []

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
