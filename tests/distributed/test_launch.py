"""lab/distributed/launch.py start_uninterrupted: a stop signal during a child's start is
handled once the start returned, so the caller's cleanup finds the child stoppable."""

import signal
import threading

import pytest

from lab.distributed.launch import start_uninterrupted


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
