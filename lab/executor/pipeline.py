"""Steps submitted without waiting for them (`async_scheduling=true`): what an executor's
`execute_model_async` returns, and the order every executor keeps.

Steps run strictly one at a time in submission order, wherever they run (a worker thread, the
ranks' processes, or the caller's thread when their result is asked for). Two things rest on
it: the model runner has appended step N's sampled tokens to its token buffer before step N+1
reads them as inputs (the scheduler's placeholders), and KV blocks freed while a step is in
flight (a request finished, aborted or preempted) are written by that step before any later
step reuses them.

A *chained* step was scheduled while the step before it was still in flight, on the promise
that it succeeds. When that step fails, the chained one must not run -- the worker never saw
what it builds on -- so it raises StepSkipped without reaching the worker, and the engine takes
its schedule back (Scheduler.requeue_step). A step submitted after the engine took the failure
in is not chained and runs.

    InOrderSteps   run on the caller's thread when a result is asked for (the default of
                   Executor.execute_model_async: the simulator), or collected there in order
                   (multiproc, ray: their ranks already run the steps in order)
    ThreadedSteps  run on one worker thread (uniproc): the model runs while the engine's
                   thread schedules the next step (torch ops release the GIL)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol, TypeVar

from lab.core.step import ModelRunnerOutput

T = TypeVar("T")


class StepSkipped(RuntimeError):
    """A chained step that never ran: the step before it failed (see the module docstring)."""


class StepFuture(Protocol):
    """A submitted step: `result()` waits for its ModelRunnerOutput (or raises its error);
    `done()` says whether it is settled (False after a wait was interrupted)."""

    def result(self) -> ModelRunnerOutput: ...

    def done(self) -> bool: ...


class StepChain:
    """The skip rule, applied by whoever runs the steps, in their order."""

    def __init__(self) -> None:
        self.broken = False  # the last step failed or was skipped

    def run(self, step: Callable[[], T], chained: bool) -> T:
        if chained and self.broken:
            raise StepSkipped("not run: the step scheduled before it failed, and it was "
                              "scheduled on that step's results")
        self.broken = True
        result = step()
        self.broken = False
        return result


class PendingStep:
    """A step of InOrderSteps: settled (run, or collected) when its result is first asked
    for, after every step submitted before it."""

    def __init__(self, owner: InOrderSteps, finish: Callable[[], ModelRunnerOutput],
                 chained: bool) -> None:
        self._owner, self.finish, self.chained = owner, finish, chained
        self._settled = False
        self._value: ModelRunnerOutput | None = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._settled

    def result(self) -> ModelRunnerOutput:
        self._owner.settle_through(self)
        if self._error is not None:
            raise self._error
        return self._value

    def settle(self, chain: StepChain | None) -> None:
        try:
            self._value = chain.run(self.finish, self.chained) if chain else self.finish()
        except BaseException as e:  # noqa: BLE001 - kept: result() raises it
            self._error = e
        self._settled = True


class InOrderSteps:
    """Steps settled on the caller's thread, oldest first (see the module docstring). With
    `chain` the StepChain rule applies (steps that run here); without it (steps the ranks
    already run) each is only collected."""

    def __init__(self, chain: bool = True) -> None:
        self._pending: deque[PendingStep] = deque()
        self._chain = StepChain() if chain else None

    def submit(self, finish: Callable[[], ModelRunnerOutput], chained: bool = False) -> PendingStep:
        step = PendingStep(self, finish, chained)
        self._pending.append(step)
        return step

    def settle_through(self, step: PendingStep) -> None:
        while not step.done():
            self._pending.popleft().settle(self._chain)

    def drain(self) -> None:
        """Settle every step submitted so far (before a call whose answers come after theirs)."""
        if self._pending:
            self.settle_through(self._pending[-1])


class ThreadedSteps:
    """Steps run by one worker thread, in submission order (StepChain rule). `bind_thread` runs
    first on that thread (e.g. to select the worker's CUDA device, which is per thread)."""

    def __init__(self, run: Callable[[object], ModelRunnerOutput],
                 bind_thread: Callable[[], None] | None = None) -> None:
        self._run = run
        self._chain = StepChain()  # touched only by the worker thread
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="lab-step", initializer=bind_thread)

    def submit(self, sched, chained: bool = False) -> Future:
        return self._pool.submit(self._chain.run, lambda: self._run(sched), chained)

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the worker thread after the steps submitted so far; its result."""
        return self._pool.submit(fn).result()

    def shutdown(self) -> None:
        """Wait for the steps submitted so far, then end the thread."""
        self._pool.shutdown(wait=True)
