"""`executor=uniproc`: one worker in the engine's own process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lab.executor.base import Executor, ModelInfo, call_worker
from lab.scheduler.output import ModelRunnerOutput, SchedulerOutput
from lab.worker.config import WorkerConfig
from lab.worker.worker import CacheSizing, Worker


class UniprocExecutor(Executor):
    """Calls a single in-process Worker directly."""

    def __init__(self, config: WorkerConfig) -> None:
        self.check_tensor_parallel(config.parallel.tensor_parallel_size)
        self.worker = Worker(config)

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

    def collective_rpc(
        self, method: str | Callable, args: tuple = (), kwargs: dict | None = None,
    ) -> list[Any]:
        return [call_worker(self.worker, method, args, kwargs or {})]
