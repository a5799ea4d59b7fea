"""Taking back a step that failed, for the Scheduler (a mixin: it works on the scheduler's own
running list, waiting queue and KV-cache manager).

`schedule()` promises work before it is done: it advances `num_computed_tokens` (blocks reach
the prefix cache only after the step, in update_from_output; see lab/cache/manager.py). When the
step then fails -- the executor raises, a KeyboardInterrupt lands in the forward pass, a CUDA
error -- `fail_step` takes back exactly that promise; when the scheduler itself raised,
`fail_all` gives up on every request instead of trusting half-updated state. Both leave every
block they touched free and no prefix-cache entry for KV that was never computed or copied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lab.engine.request import Request, RequestStatus

if TYPE_CHECKING:
    from lab.cache.manager import KVCacheManager
    from lab.scheduler.output import SchedulerOutput
    from lab.scheduler.queues import RequestQueue


class StepRecovery:
    """fail_step / fail_all for Scheduler, which supplies the state below and `_detach(req)`
    (out of running / waiting) and `_finish(req, status)` (free its blocks, forget it)."""

    kv: KVCacheManager
    waiting: RequestQueue
    running: list[Request]
    requests: dict[str, Request]
    finished_req_ids: set[str]

    def fail_step(self, sched: SchedulerOutput) -> list[Request]:
        """Take back a step whose execution failed (the executor raised or was interrupted).

        Exactly the requests it scheduled finish with `error`: their computed-token counts go
        back to what the step started from and every block is freed (none of the step's blocks
        was committed to the prefix cache). Victims swapped out by the step fall back to recompute (the copies may not have
        happened); requests the step did not schedule are untouched. Returns the failed
        requests.
        """
        self.finished_req_ids |= sched.finished_req_ids  # the worker may not have seen them
        for rid in sched.preempted_req_ids:
            self._unswap(self.requests.get(rid))
        failed = []
        for data in (*sched.scheduled_new_reqs, *sched.scheduled_cached_reqs):
            req = self.requests.get(data.req_id)
            if req is None or req.is_finished:
                continue
            req.num_computed_tokens = data.num_computed_tokens  # before this step
            self._detach(req)
            self._finish(req, RequestStatus.FINISHED_ERROR)
            failed.append(req)
        return failed

    def _unswap(self, req: Request | None) -> None:
        """A victim swapped out by a failed step is recomputed instead (its hashes stay)."""
        if req is None or req.status != RequestStatus.SWAPPED:
            return
        self.kv.discard_swapped(req.request_id)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.times.swapped_at = None

    def fail_all(self) -> list[Request]:
        """After a failure inside schedule() or update_from_output() the scheduler's own state
        cannot be trusted: every unfinished request finishes with `error`, every block is freed,
        the prefix cache and this step's swaps are dropped. Returns the failed requests."""
        failed = [r for r in self.requests.values() if not r.is_finished]
        for req in failed:
            self._finish(req, RequestStatus.FINISHED_ERROR)
        self.running.clear()
        for req in list(self.waiting):
            self.waiting.remove(req)
        self.kv.free_all()
        self.kv.take_swap_step()
        self.kv.reset_prefix_cache()
        return failed

    def describe_unfinished(self) -> str:
        """One line per unfinished request (status, computed/total tokens) for error messages."""
        return "; ".join(repr(r) for r in self.requests.values() if not r.is_finished)
