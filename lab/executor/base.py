"""Executor: how the engine reaches its worker(s). Base class of the `executor` group.

The engine builds an executor from a `WorkerConfig` (`instantiate(cfg.executor)(config=...)`)
and learns what it needs about the model only through `model_info()`; it never touches a worker.
`collective_rpc(method, args, kwargs)` runs a Worker method on every rank (one for uniproc, one
per rank for multiproc and ray) and `shutdown()` releases what the executor started; the engine
calls it when it shuts down (EngineCore.shutdown), so it works the same over every executor.
The executor also owns the engine's clock: wall time for real executors, a virtual clock that
the simulator advances by each step's predicted duration.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lab.clock import Clock
from lab.core.model_info import ModelInfo

if TYPE_CHECKING:
    from lab.cache.sizing import CacheSizing
    from lab.core.step import ModelRunnerOutput, SchedulerOutput
    from lab.executor.pipeline import StepFuture


class Executor(ABC):
    """Runs the worker(s): sizing the cache, allocating it, executing steps."""

    #: the engine's clock (see lab/clock.py); the simulator replaces it with a VirtualClock
    clock: Clock = Clock()
    #: False for executors that launch no kernels (the simulator)
    runs_kernels: bool = True
    #: whether it runs a model split over ranks (tensor_parallel_size > 1; knob validation
    #: refuses it for executors that cannot)
    supports_tensor_parallel: bool = False

    def timing(self) -> str:
        """What the run's times are (a summary says it): wall-clock time of real steps."""
        return "wall clock"

    @classmethod
    def check_tensor_parallel(cls, tensor_parallel_size: int) -> None:
        """Refuse a split model this executor cannot run (ValueError naming the executors that
        can); knob validation and the executor's constructor both ask."""
        if tensor_parallel_size > 1 and not cls.supports_tensor_parallel:
            raise ValueError(
                f"tensor_parallel_size={tensor_parallel_size} is invalid with {cls.__name__}, "
                "which runs one worker in one process: use executor=multiproc (one process per "
                "rank on this machine), executor=ray (one actor per rank) or executor=sim "
                "(simulated)")

    @abstractmethod
    def model_info(self) -> ModelInfo:
        """The model's config, vocabulary, EOS, KV bytes per block and weight bytes."""

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

    def execute_model_async(self, sched: SchedulerOutput, chained: bool = False) -> StepFuture:
        """Submit one step without waiting for it (async_scheduling); steps run in submission
        order, and a `chained` step (scheduled while the previous one was in flight) is skipped
        when that one failed (lab/executor/pipeline.py). Default: the step runs on the caller's
        thread when its result is asked for (the simulator: its clock advances then, while the
        engine has already scheduled the next step, as a device would)."""
        from lab.executor.pipeline import InOrderSteps

        steps = self.__dict__.setdefault("_in_order_steps", InOrderSteps())
        return steps.submit(lambda: self.execute_model(sched), chained)

    def collective_rpc(
        self, method: str | Callable, args: tuple = (), kwargs: dict | None = None,
    ) -> list[Any]:
        """Run `Worker.<method>(*args, **kwargs)` on every rank (a callable: `method(worker,
        *args, **kwargs)`; importable by name for executors whose ranks are processes); the
        results in rank order."""
        raise NotImplementedError(f"{type(self).__name__} has no worker to call {method!r} on")

    def shutdown(self) -> None:
        """Release the worker(s) this executor started (processes, actors, process groups);
        idempotent. Nothing to do in-process."""
        return None


def call_worker(worker: Any, method: str | Callable, args: tuple, kwargs: dict) -> Any:
    """One rank's part of `collective_rpc`: a Worker method by name, or a function of it."""
    if callable(method):
        return method(worker, *args, **kwargs)
    return getattr(worker, method)(*args, **kwargs)
