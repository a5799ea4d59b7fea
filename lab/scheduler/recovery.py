"""Taking back a step that failed, for the Scheduler (a mixin: it works on the scheduler's own
running list, waiting queue and KV-cache manager).

`schedule()` promises work before it is done: it advances `num_computed_tokens` (blocks reach
the prefix cache only after the step, in update_from_output; see lab/cache/manager.py). When the
step then fails -- the executor raises, a KeyboardInterrupt lands in the forward pass, a CUDA
error -- `fail_step` takes back exactly that promise; when the scheduler itself raised,
`fail_all` gives up on every request instead of trusting half-updated state. Both leave every
block they touched free and no prefix-cache entry for KV that was never computed or copied.

With async scheduling a step can also be *skipped*: it was scheduled while the step before it
ran, on that step's promise, and that step failed, so the executor never ran it
(lab/executor/pipeline.py). `requeue_step` takes it back without failing anyone: its requests
wait again and are recomputed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from lab.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from lab.cache.manager import KVCacheManager
    from lab.core.step import SchedulerOutput
    from lab.scheduler.queues import RequestQueue


class StepRecovery:
    """fail_step / requeue_step / fail_all for Scheduler, which supplies the state below,
    `_detach(req)` (out of running / waiting), `_finish(req, status)` (free its blocks, forget
    it), `_forget_in_flight(req)` and `take_step_requests(sched)` (the Request objects a step
    scheduled)."""

    kv: KVCacheManager
    waiting: RequestQueue
    running: list[Request]
    requests: dict[str, Request]
    finished_req_ids: set[str]
    _steps: dict

    def take_step_requests(self, sched: SchedulerOutput) -> Iterator[tuple[str, Request, int]]:
        raise NotImplementedError

    def _forget_in_flight(self, req: Request) -> None:
        """Drop what the scheduler expects from `req`'s steps in flight (async placeholders)."""

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
        for rid, req, computed in self.take_step_requests(sched):
            if req.is_finished:
                continue
            if req.status == RequestStatus.RUNNING:
                req.num_computed_tokens = computed - sched.num_scheduled_tokens[rid]  # before
            self._detach(req)
            self._finish(req, RequestStatus.FINISHED_ERROR)
            failed.append(req)
        return failed

    def requeue_step(self, sched: SchedulerOutput) -> list[Request]:
        """Take back a step that never ran (skipped, see the module docstring): every request it
        scheduled goes back to the front of the waiting queue with its blocks freed, to be
        recomputed (those it admitted as new start over as new: the worker never saw them);
        victims it swapped out are recomputed instead (the copies never happened). Nothing is
        failed. Returns the requests taken back."""
        self.finished_req_ids |= sched.finished_req_ids
        for rid in sched.preempted_req_ids:
            self._unswap(self.requests.get(rid))
        new = {d.req_id for d in sched.scheduled_new_reqs}
        taken = [(rid, req) for rid, req, _ in self.take_step_requests(sched)
                 if not req.is_finished]
        for rid, req in reversed(taken):  # prepended last-first: they keep their order
            self._detach(req)
            self._forget_in_flight(req)
            self.kv.release(req)  # device blocks, and swap blocks a resume had not copied yet
            req.num_computed_tokens = 0
            req.status = RequestStatus.WAITING if rid in new else RequestStatus.PREEMPTED
            self.waiting.prepend(req)
        return [req for _, req in taken]

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
        self._steps.clear()
        self.kv.free_all()
        self.kv.take_swap_step()
        self.kv.reset_prefix_cache()
        return failed

    def describe_unfinished(self) -> str:
        """One line per unfinished request (status, computed/total tokens) for error messages."""
        return "; ".join(repr(r) for r in self.requests.values() if not r.is_finished)
