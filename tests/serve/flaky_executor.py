"""An executor whose execute_model raises on chosen calls (counted from 1), or takes at least
`min_step_s` per step (so a test can act mid-stream), built through the executor config group
like any other, so it also runs inside an engine-core process:

    executor._target_=tests.serve.flaky_executor.FlakyExecutor +executor.fail_on_calls=[2]
"""

from __future__ import annotations

import time

from lab.config.worker import WorkerConfig
from lab.core.step import ModelRunnerOutput, SchedulerOutput
from lab.executor.uniproc import UniprocExecutor


class FlakyExecutor(UniprocExecutor):
    def __init__(self, config: WorkerConfig, fail_on_calls: list[int] = (),
                 min_step_s: float = 0.0) -> None:
        super().__init__(config)
        self.fail_on_calls = set(fail_on_calls)
        self.min_step_s = min_step_s
        self.calls = 0

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        self.calls += 1
        if self.calls in self.fail_on_calls:
            raise RuntimeError(f"injected fault on execute_model call {self.calls}")
        start = time.monotonic()
        result = super().execute_model(sched)
        time.sleep(max(0.0, self.min_step_s - (time.monotonic() - start)))
        return result
