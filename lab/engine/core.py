"""EngineCore: the step loop — schedule, execute, update — and the step's statistics."""

from __future__ import annotations

import time
from collections.abc import Callable

from lab.engine.request import Request
from lab.executor.base import Executor
from lab.metrics.stats import StepStats
from lab.scheduler.scheduler import Scheduler


class EngineStuckError(RuntimeError):
    """A step scheduled nothing and preempted nothing while requests were unfinished: no later
    step could make progress either. A scheduler bug, reported instead of spinning."""


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
        self._failed: list[Request] = []

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> list[Request]:
        return self.scheduler.abort_requests(request_ids)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> tuple[list[Request], StepStats]:
        """Run one step; return the requests that got a token (finished ones included).

        A step that raises (any exception, KeyboardInterrupt included) re-raises after the
        scheduler has failed exactly the requests it scheduled (`Scheduler.fail_step`), or every
        unfinished request when the scheduler itself raised (`Scheduler.fail_all`); those are
        then in `take_failed()`, finished with reason `error`, their blocks freed.
        """
        t0 = self.clock()
        sched = self._guarded(self.scheduler.schedule, self.scheduler.fail_all)
        t1 = self.clock()
        result = self._guarded(lambda: self.executor.execute_model(sched),
                               lambda: self.scheduler.fail_step(sched))
        t2 = self.clock()
        updated = self._guarded(lambda: self.scheduler.update_from_output(sched, result),
                                self.scheduler.fail_all)
        stats = self._make_stats(sched, updated, t1 - t0, t2 - t1, self.clock() - t2)
        self.step_count += 1
        self._check_progress(sched)
        return updated, stats

    def _guarded(self, run: Callable[[], object], fail: Callable[[], list[Request]]):
        try:
            return run()
        except BaseException:
            self._failed.extend(fail())
            raise

    def _check_progress(self, sched) -> None:
        """An empty step that preempted nothing while requests wait would repeat forever."""
        if not sched.is_empty or sched.preempted_req_ids:
            return
        if not self.scheduler.has_unfinished_requests():
            return
        state = self.scheduler.describe_unfinished()
        self._failed.extend(self.scheduler.fail_all())
        raise EngineStuckError(
            f"engine step {self.step_count - 1} scheduled no token and preempted nothing while "
            f"requests were unfinished ({state}); they were failed with finish reason 'error' "
            "so the engine can go on. This is a scheduler bug: please report it.")

    def take_failed(self) -> list[Request]:
        """Requests failed by steps that raised since the last call."""
        failed, self._failed = self._failed, []
        return failed

    def _make_stats(
        self, sched, updated: list[Request], t_sched: float, t_exec: float, t_update: float,
    ) -> StepStats:
        st = self.scheduler.stats()
        ev, kv = st.events, st.kv
        return StepStats(
            step=self.step_count,
            time=self.clock() - self.origin,
            num_running_reqs=st.num_running_reqs,
            num_waiting_reqs=st.num_waiting_reqs,
            num_swapped_reqs=st.num_swapped_reqs,
            num_scheduled_tokens=sched.total_num_scheduled_tokens,
            num_prefill_tokens=ev.num_prefill_tokens,
            num_decode_tokens=ev.num_decode_tokens,
            num_scheduled_reqs=len(sched.num_scheduled_tokens),
            num_preempted=ev.num_preempted,
            preempted_by_strategy=dict(ev.preempted_by_strategy),
            kv_cache_usage=kv.usage,
            kv_blocks_used=kv.num_used_blocks,
            kv_blocks_total=kv.num_blocks,
            prefix_cache_queries=kv.prefix.queries,
            prefix_cache_hits=kv.prefix.hits,
            num_evicted_blocks=kv.num_evicted_blocks,
            swap_out_blocks=ev.swap_out_blocks,
            swap_in_blocks=ev.swap_in_blocks,
            swap_out_bytes=ev.swap_out_blocks * kv.bytes_per_block,
            swap_in_bytes=ev.swap_in_blocks * kv.bytes_per_block,
            num_swap_fallbacks=ev.num_swap_fallbacks,
            swap_in_cached_blocks=ev.swap_in_cached_blocks,
            num_finished=sum(r.is_finished for r in updated),
            num_generated_tokens=len(updated),
            num_prefill_reqs=sched.shape.num_prefill_reqs,
            num_decode_reqs=sched.shape.num_decode_reqs,
            prefill_attention_pairs=sched.shape.prefill_attention_pairs,
            decode_context_tokens=sched.shape.decode_context_tokens,
            schedule_time=t_sched,
            execute_time=t_exec,
            update_time=t_update,
        )
