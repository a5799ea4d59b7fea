"""EngineCore's loop with async scheduling (`async_scheduling=true`, vLLM V1's async scheduling;
the scheduler is an AsyncScheduler): a step() schedules and submits step N+1 before it waits for
step N, so the scheduler's work overlaps the model's. At most ASYNC_DEPTH steps are in flight:

    step() call   k                      k+1
    engine        schedule N+1, submit,  | schedule N+2, submit,
                  wait N, update N       | wait N+1, update N+1
    executor      ... N ... | ... N+1 ...... | ... N+2 ...
    returns       N's outputs and StepStats (one StepStats per executed step); the very first
                  call only submits (nothing back yet)

A step whose schedule has nothing for the worker is not submitted. When step N fails, the step
scheduled behind it on its promise is skipped by the executor and taken back without failing
anyone (Scheduler.requeue_step); then step() raises N's error, N's requests failed as in the
synchronous loop (EngineCore.step). An interrupt (KeyboardInterrupt) while waiting for a step
leaves it in flight: the next step() waits for it again. In StepStats, `execute_time` is the
time the engine waited for the step's result: the part of its run not hidden behind scheduling.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lab.core.protocol import EngineCoreOutput, EngineCoreOutputs
from lab.core.step import ModelRunnerOutput, SchedulerOutput
from lab.executor.pipeline import StepFuture, StepSkipped
from lab.scheduler.scheduler import StepEvents

if TYPE_CHECKING:
    from lab.core.request import Request
    from lab.executor.base import Executor
    from lab.scheduler.scheduler import Scheduler

#: steps in flight at most: the one running and the one scheduled behind it
ASYNC_DEPTH = 2


@dataclass
class InFlightStep:
    """A step submitted whose result the engine has not taken in yet."""

    sched: SchedulerOutput
    future: StepFuture
    events: StepEvents  # the scheduler's events of this step's schedule()
    schedule_time: float


class AsyncSteps:
    """The async loop of EngineCore (a mixin: besides the state below it uses the core's
    `_guarded`, `_outputs`, `_make_stats` and `_check_progress`)."""

    scheduler: Scheduler
    executor: Executor
    clock: Callable[[], float]
    step_count: int
    _failed: list[Request]
    _in_flight: deque[InFlightStep]
    _carried: list[EngineCoreOutput]  # outputs due with the next step()

    def _step_async(self) -> EngineCoreOutputs:
        """Submit the next step while fewer than ASYNC_DEPTH are in flight, then (unless the
        pipeline is still filling) take in the oldest step's result."""
        if len(self._in_flight) < ASYNC_DEPTH and self.scheduler.has_unfinished_requests():
            if self._submit_next() and len(self._in_flight) < ASYNC_DEPTH:
                return EngineCoreOutputs([])
        if not self._in_flight:
            return EngineCoreOutputs([])
        return self._take_in_oldest()

    def _submit_next(self) -> bool:
        """Schedule a step and submit it; False when it had nothing for the worker."""
        t0 = self.clock()
        sched = self._guarded(self.scheduler.schedule, self.scheduler.fail_all)
        if not sched.has_work:
            if not self._in_flight:
                self._check_progress(sched)
            return False
        chained = bool(self._in_flight)  # scheduled on the promise of the step in flight
        future = self._guarded(lambda: self.executor.execute_model_async(sched, chained),
                               lambda: self.scheduler.fail_step(sched))
        self._in_flight.append(InFlightStep(sched, future, self.scheduler.events, self.clock() - t0))
        return True

    def _take_in_oldest(self) -> EngineCoreOutputs:
        step = self._in_flight[0]
        t0 = self.clock()
        try:
            result = step.future.result()
        except BaseException as e:
            if not step.future.done():
                raise  # the wait was interrupted, not the step: the next step() waits again
            self._in_flight.popleft()
            self._take_back(step, e)
            self._settle_in_flight()
            if isinstance(e, StepSkipped):  # its failed predecessor was reported already
                return EngineCoreOutputs([])
            raise
        self._in_flight.popleft()
        t1 = self.clock()
        outputs, updated = self._update(step, result)
        stats = self._make_stats(step.sched, step.events, updated, result, step.schedule_time,
                                 t1 - t0, self.clock() - t1)
        self.step_count += 1
        return EngineCoreOutputs(outputs, stats)

    def _update(self, step: InFlightStep, result: ModelRunnerOutput,
                ) -> tuple[list[EngineCoreOutput], list[Request]]:
        """A step's result into the scheduler: (its outputs, the requests that got a token)."""
        scheduled = self.scheduler.step_requests(step.sched)
        updated = self._guarded(lambda: self.scheduler.update_from_output(step.sched, result),
                                self.scheduler.fail_all)
        return self._outputs(updated, result, scheduled), updated

    def _take_back(self, step: InFlightStep, error: BaseException) -> None:
        """A step that raised fails its requests; one skipped is requeued."""
        if isinstance(error, StepSkipped):
            self.scheduler.requeue_step(step.sched)
        else:
            self._failed.extend(self.scheduler.fail_step(step.sched))

    def _settle_in_flight(self) -> None:
        """After a failed step, the steps scheduled behind it: each skipped (requeued), failed,
        or -- an executor that ran it anyway -- taken in (its outputs come with the next step),
        before anything is scheduled on their promises."""
        while self._in_flight:
            step = self._in_flight[0]
            try:
                result = step.future.result()
            except BaseException as e:
                if not step.future.done():
                    raise
                self._in_flight.popleft()
                self._take_back(step, e)
                continue
            self._in_flight.popleft()
            self._carried.extend(self._update(step, result)[0])

