"""EngineCore: the step loop — schedule, execute, update — and the step's statistics."""

from __future__ import annotations

import time
from collections.abc import Callable

from lab.engine.request import Request
from lab.executor.base import Executor
from lab.metrics.stats import StepStats
from lab.scheduler.scheduler import Scheduler


class EngineCore:
    """Owns the scheduler and the executor; one `step()` is one forward pass."""

    def __init__(
        self, scheduler: Scheduler, executor: Executor,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.clock = clock
        self.origin = clock()
        self.step_count = 0

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> list[Request]:
        return self.scheduler.abort_requests(request_ids)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> tuple[list[Request], StepStats]:
        """Run one step; return the requests that got a token (finished ones included)."""
        t0 = self.clock()
        sched = self.scheduler.schedule()
        t1 = self.clock()
        result = self.executor.execute_model(sched)
        t2 = self.clock()
        updated = self.scheduler.update_from_output(sched, result)
        stats = self._make_stats(sched, updated, t1 - t0, t2 - t1)
        self.step_count += 1
        return updated, stats

    def _make_stats(self, sched, updated: list[Request], t_sched: float, t_exec: float) -> StepStats:
        s, kv = self.scheduler, self.scheduler.kv
        prefix = kv.take_prefix_cache_stats()
        return StepStats(
            step=self.step_count,
            time=self.clock() - self.origin,
            num_running_reqs=len(s.running),
            num_waiting_reqs=s.num_waiting - s.num_swapped,  # swapped ones counted apart
            num_swapped_reqs=s.num_swapped,
            num_scheduled_tokens=sched.total_num_scheduled_tokens,
            num_prefill_tokens=s.events.num_prefill_tokens,
            num_decode_tokens=s.events.num_decode_tokens,
            num_scheduled_reqs=len(sched.num_scheduled_tokens),
            num_preempted=s.events.num_preempted,
            preempted_by_strategy=dict(s.events.preempted_by_strategy),
            kv_cache_usage=kv.usage,
            kv_blocks_used=kv.num_used_blocks,
            kv_blocks_total=kv.num_blocks - 1,
            prefix_cache_queries=prefix.queries,
            prefix_cache_hits=prefix.hits,
            num_evicted_blocks=kv.take_num_evicted(),
            swap_out_blocks=s.events.swap_out_blocks,
            swap_in_blocks=s.events.swap_in_blocks,
            swap_out_bytes=s.events.swap_out_blocks * kv.bytes_per_block,
            swap_in_bytes=s.events.swap_in_blocks * kv.bytes_per_block,
            num_swap_fallbacks=s.events.num_swap_fallbacks,
            num_finished=sum(r.is_finished for r in updated),
            num_generated_tokens=len(updated),
            schedule_time=t_sched,
            execute_time=t_exec,
        )
