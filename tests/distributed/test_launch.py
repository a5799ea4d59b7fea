"""lab/distributed/launch.py: start_uninterrupted (a stop signal during a child's start is
handled once the start returned, so the caller's cleanup finds the child stoppable), the
fork server's heap frozen for its children (lab/engine/fork_server_gc.py), and a temporary
directory too long for the processes' Unix sockets named as such."""

import gc
import shutil
import signal
import tempfile
import threading
from pathlib import Path

import pytest

from lab import LLM
from lab.distributed.launch import (
    LONGEST_SOCKET_NAME,
    mp_context,
    socket_tempdir,
    start_uninterrupted,
)


class SignalledStart:
    """A process whose start() gets SIGTERM halfway (as `lab serve` did while the fork server
    answered) and then finishes starting."""

    def __init__(self) -> None:
        self.started = False

    def start(self) -> None:
        signal.raise_signal(signal.SIGTERM)
        self.started = True


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def test_a_stop_signal_during_the_start_is_handled_after_it():
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        proc = SignalledStart()
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            start_uninterrupted(proc)
        assert proc.started  # the start completed first: the caller can stop what it started
        assert signal.getsignal(signal.SIGTERM) is _interrupt  # the caller's handler is back
        proc = SignalledStart()
        with pytest.raises(KeyboardInterrupt):  # without it, the start itself is cut off
            proc.start()
        assert not proc.started
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_off_the_main_thread_it_is_a_plain_start():
    started = []

    class Quiet:
        def start(self):
            started.append(threading.current_thread().name)

    t = threading.Thread(target=start_uninterrupted, args=(Quiet(),), name="starter")
    t.start()
    t.join()
    assert started == ["starter"]


def _gc_view(conn) -> None:
    conn.send((gc.get_freeze_count(), len(gc.get_objects())))
    conn.close()


def test_a_fork_server_child_inherits_a_frozen_heap():
    """What the fork server imported (torch, transformers, lab's engine code) is frozen before
    it forks: a child's collections walk only what the child made. Unfrozen, each child's first
    full collection walked the ~325k inherited objects (0.19 CPU-s; every core, rank and test
    command paid it)."""
    ctx = mp_context("forkserver")
    ours, theirs = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_gc_view, args=(theirs,))
    child.start()
    theirs.close()
    frozen, tracked = ours.recv()
    child.join(timeout=60)
    assert frozen > 100_000  # torch alone is more
    assert tracked < frozen / 10, (frozen, tracked)


@pytest.mark.parametrize("start", ["fork server", "engine_client=mp", "executor=multiproc"])
def test_a_temporary_directory_too_long_for_unix_sockets_is_named(start, monkeypatch):
    """The fork server's listener and lab's IPC sockets live under the temporary directory; one
    too long for the listener's path used to end the first start in `OSError: AF_UNIX path too
    long` from inside multiprocessing (mp_context itself said nothing). Now: a ValueError naming
    TMPDIR before anything is made."""
    base = Path(tempfile.mkdtemp())  # short: pytest's tmp_path can be too long by itself
    long = base / ("d" * (107 - LONGEST_SOCKET_NAME - len(str(base))))  # one byte too long
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    with pytest.raises(ValueError, match=r"TMPDIR=.* bytes long: .* set TMPDIR to a shorter"):
        if start == "fork server":
            mp_context("forkserver")
        else:
            knobs = ({"engine_client": "mp"} if start == "engine_client=mp" else
                     {"executor": "multiproc", "tensor_parallel_size": 2})
            LLM("tiny_llama", attention="torch", num_gpu_blocks=16, **knobs)
    made = list(long.iterdir())
    monkeypatch.setattr(tempfile, "tempdir", str(long)[:-1])  # one byte shorter: room enough
    shorter = socket_tempdir()
    shutil.rmtree(base)
    assert made == []
    assert shorter == str(long)[:-1]
