"""`executor=uniproc`: one worker in the engine's own process.

With async scheduling (`execute_model_async`) the worker runs its steps on one thread of its
own, in submission order (lab/executor/pipeline.py), while the engine's thread schedules the
next step: torch releases the GIL in its ops, so the scheduler's Python overlaps the model's
kernels (on a GPU, the launches and copies too). The thread is started by the first async step
and joined by `shutdown()`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lab.cache.sizing import CacheSizing
from lab.config.worker import WorkerConfig
from lab.core.model_info import ModelInfo
from lab.core.step import ModelRunnerOutput, SchedulerOutput
from lab.executor.base import Executor, call_worker
from lab.executor.pipeline import StepFuture, ThreadedSteps
from lab.worker.worker import Worker


class UniprocExecutor(Executor):
    """Calls a single in-process Worker directly (async steps: on its step thread)."""

    def __init__(self, config: WorkerConfig) -> None:
        self.check_tensor_parallel(config.parallel.tensor_parallel_size)
        self.worker = Worker(config)
        self._steps: ThreadedSteps | None = None

    def model_info(self) -> ModelInfo:
        return self.worker.model_info()

    def determine_num_blocks(self, sizing: CacheSizing) -> int:
        return self.worker.determine_num_blocks(sizing)

    def initialize_cache(
        self, num_blocks: int, max_model_len: int, num_swap_blocks: int = 0
    ) -> None:
        self.worker.initialize_cache(num_blocks, max_model_len, num_swap_blocks)

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        return self.worker.execute_model(sched)

    def execute_model_async(self, sched: SchedulerOutput, chained: bool = False) -> StepFuture:
        if self._steps is None:
            # execute_model looked up per step: a test may wrap it to inject a fault
            self._steps = ThreadedSteps(lambda s: self.execute_model(s), self._bind_thread)
        return self._steps.submit(sched, chained)

    def _bind_thread(self) -> None:
        """The step thread uses the worker's CUDA device (the current device is per thread)."""
        if self.worker.device.type == "cuda":
            torch.cuda.set_device(self.worker.device)

    def collective_rpc(
        self, method: str | Callable, args: tuple = (), kwargs: dict | None = None,
    ) -> list[Any]:
        call = lambda: call_worker(self.worker, method, args, kwargs or {})  # noqa: E731
        # once there is a step thread, after its steps (never beside one on the worker)
        return [call() if self._steps is None else self._steps.call(call)]

    def shutdown(self) -> None:
        """Join the step thread (after the steps submitted so far)."""
        if self._steps is not None:
            self._steps.shutdown()
            self._steps = None
