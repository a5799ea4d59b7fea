"""Executor: how the engine reaches its worker(s). Base class of the `executor` group."""

from __future__ import annotations

from abc import ABC, abstractmethod

from lab.scheduler.output import ModelRunnerOutput, SchedulerOutput
from lab.worker.worker import CacheSizing, Worker


class Executor(ABC):
    """Runs the worker(s): sizing the cache, allocating it, executing steps."""

    #: the worker that holds the model (rank 0 where there are several)
    worker: Worker

    @abstractmethod
    def determine_num_blocks(self, sizing: CacheSizing) -> int:
        """How many KV blocks fit (the minimum over workers)."""

    @abstractmethod
    def initialize_cache(
        self, num_blocks: int, max_model_len: int, num_swap_blocks: int = 0
    ) -> None:
        """Allocate the KV cache (and a CPU swap space of `num_swap_blocks`) on every worker."""

    @abstractmethod
    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step."""
