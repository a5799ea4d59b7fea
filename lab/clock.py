"""The engine's one clock: wall time on a device, virtual time under `executor=sim`.

The executor owns the clock (`Executor.clock`): a real executor measures wall time; the
simulator advances a `VirtualClock` by each step's predicted duration. The engine hands
`clock.now` to the EngineCore and the Scheduler and uses `clock.sleep` while it waits for the
next arrival, so every timestamp of a run (arrival, first token, finish, step times) comes from
the same clock. Plain Python: importing it does not import torch.
"""

from __future__ import annotations

import time


class Clock:
    """Wall-clock time (seconds, monotonic, arbitrary origin)."""

    def now(self) -> float:
        return time.perf_counter()

    def sleep(self, seconds: float) -> None:
        """Wait `seconds` (nothing when <= 0)."""
        if seconds > 0:
            time.sleep(seconds)

    def sleep_until(self, deadline: float) -> None:
        """Wait until now() >= deadline (nothing when it is already past)."""
        self.sleep(deadline - self.now())


class VirtualClock(Clock):
    """Time that moves only when told: `advance` (a simulated step) or `sleep` (idle wait)."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock cannot go back ({seconds} s)")
        self._now += seconds

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._now += seconds

    def sleep_until(self, deadline: float) -> None:
        """Jump to `deadline` exactly: `now + (deadline - now)` can round below it, and a
        waiter comparing now() with its deadline would then wait forever."""
        self._now = max(self._now, float(deadline))
