"""EngineCore: the step loop — schedule, execute, update — and the step's statistics.

It deals only in token ids: `EngineCoreRequest`s in, `EngineCoreOutput`s out (lab/engine/
protocol.py). Text, stop strings and RequestOutputs are the frontend's (OutputProcessor).

With `async_scheduling` a step() submits one step and takes in the one before: see
lab/engine/async_steps.py.
"""

from __future__ import annotations

import atexit
import gc
import time
from collections import deque
from collections.abc import Callable

from lab.core.protocol import CoreStatus, EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from lab.core.request import Request, RequestStatus
from lab.core.stats import RequestStats, StepStats
from lab.core.step import ModelRunnerOutput
from lab.engine.async_steps import AsyncSteps, InFlightStep
from lab.executor.base import Executor
from lab.scheduler.scheduler import Scheduler, StepEvents


def freeze_gc_heap() -> None:
    """Collect, then move every object the cyclic GC tracks to its permanent generation, as
    vLLM's EngineCore does once it has started: the model, compiled graphs and imported modules
    live as long as the engine, and a full collection while serving would walk them all again
    (lab.bench.overhead's schedule + update per step, unfrozen and frozen:
    experiments/results/2026-12-05-cpu-fp32-ordered.md, section 6). EngineCore.shutdown()
    unfreezes it, so an engine dropped in-process (tests, notebooks) can be collected, and so
    does the interpreter's exit (extensions that count their live objects at exit, as Triton's
    nanobind does, would report the frozen ones as leaks)."""
    gc.collect()
    gc.freeze()
    atexit.unregister(unfreeze_gc_heap)  # one registration however many engines start
    atexit.register(unfreeze_gc_heap)


def unfreeze_gc_heap() -> None:
    """Hand the frozen objects back to the collector (an engine's shutdown)."""
    gc.unfreeze()


class EngineStuckError(RuntimeError):
    """A step scheduled nothing and preempted nothing while requests were unfinished: no later
    step could make progress either. A scheduler bug, reported instead of spinning."""


class EngineDeadError(RuntimeError):
    """The engine can serve nothing any more: its core process (engine_client=mp) or the thread
    that steps it (AsyncLLM) is gone."""


class EngineCore(AsyncSteps):
    """Owns the scheduler and the executor; one `step()` is one forward pass (with async
    scheduling: submits one and takes in the result of the one before)."""

    def __init__(
        self, scheduler: Scheduler, executor: Executor,
        clock: Callable[[], float] = time.perf_counter,
        block_hasher: Callable[[Request], list[bytes]] | None = None,
        async_scheduling: bool = False,
    ) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.clock = clock
        self.block_hasher = block_hasher
        self.origin = clock()
        self.step_count = 0
        self._failed: list[Request] = []
        self.async_scheduling = async_scheduling
        self._in_flight: deque[InFlightStep] = deque()
        self._carried: list[EngineCoreOutput] = []  # outputs due with the next step()

    def add_request(self, request: EngineCoreRequest) -> None:
        self.scheduler.add_request(Request(
            request.request_id, request.prompt_token_ids, request.sampling_params,
            request.eos_token_id, request.arrival_time, priority=request.priority,
            client_id=request.client_id, block_hasher=self.block_hasher))

    def abort_requests(
        self, request_ids: list[str], status: RequestStatus = RequestStatus.FINISHED_ABORTED,
    ) -> list[EngineCoreOutput]:
        """Finish requests (aborted, or stopped by the frontend's stop string); their final
        outputs carry no new token."""
        return [self._final(r, []) for r in self.scheduler.abort_requests(request_ids, status)]

    def has_unfinished_requests(self) -> bool:
        """Requests waiting or running, or steps in flight (async scheduling)."""
        return self.scheduler.has_unfinished_requests() or bool(self._in_flight)

    def shutdown(self) -> None:
        """Release the executor's workers (rank processes, actors, the step thread, after the
        steps in flight); an mp client stops its core process here, which calls this one.
        Then the heap frozen at start-up (freeze_gc_heap) goes back to the collector."""
        self.executor.shutdown()
        unfreeze_gc_heap()

    #: the methods a client may run by name (`call_utility`; over ZMQ for a core process),
    #: with the type of their result (a remote client converts the plain data back to it)
    UTILITIES: dict[str, type] = {"status": CoreStatus, "reset_prefix_cache": bool,
                                  "reset_for_run": bool}

    def call_utility(self, method: str, *args):
        """Run one of UTILITIES (a client's request by name); an unknown name is a ValueError
        naming the allowed ones."""
        if method not in self.UTILITIES:
            raise ValueError(f"utility {method!r} is not one of {sorted(self.UTILITIES)}")
        return getattr(self, method)(*args)

    def status(self) -> CoreStatus:
        """Requests and device KV blocks in use now (see CoreStatus)."""
        s, kv = self.scheduler, self.scheduler.kv
        return CoreStatus(len(s.requests), len(s.running), len(s.requests) - len(s.running)
                          - kv.num_swapped_reqs, kv.num_used_blocks, kv.num_blocks - 1,
                          kv.num_swapped_reqs)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (False while requests hold blocks: nothing is reset)."""
        return self.scheduler.kv.reset_prefix_cache()

    def reset_for_run(self) -> bool:
        """Start afresh after a warm-up (lab/engine/warmup.py), as if no step had run: the
        prefix cache emptied (so the run gets no hit from warm-up prompts), its lookup and
        eviction counters zeroed, the step index back to 0 and the origin of the statistics'
        times (StepStats.time, RequestStats' *_time) moved to now; and what the warm-up built
        that lives as long as the engine (first-call caches, compiled kernels) joins the heap
        frozen at start-up (freeze_gc_heap). False, and nothing done, while requests are
        unfinished."""
        if self.has_unfinished_requests() or not self.scheduler.kv.reset_prefix_cache():
            return False
        self.scheduler.kv.reset_counters()
        self.scheduler.events = StepEvents()
        self.step_count = 0
        freeze_gc_heap()
        self.origin = self.clock()
        return True

    def has_request(self, request_id: str) -> bool:
        """Whether a request of this id is in the core (waiting, running or swapped)."""
        return request_id in self.scheduler.requests

    def step(self) -> EngineCoreOutputs:
        """Run one step; return an output for every request that got a token (finished ones
        included) or prompt logprobs, with the step's statistics.

        A step that raises (any exception, KeyboardInterrupt included) re-raises after the
        scheduler has failed exactly the requests it scheduled (`Scheduler.fail_step`), or every
        unfinished request when the scheduler itself raised (`Scheduler.fail_all`); those are
        then in `take_failed()`, finished with reason `error`, their blocks freed.
        With async scheduling see the module docstring.
        """
        if self.async_scheduling:
            result = self._step_async()
            result.outputs[:0], self._carried = self._carried, []
            return result
        t0 = self.clock()
        sched = self._guarded(self.scheduler.schedule, self.scheduler.fail_all)
        t1 = self.clock()
        result = self._guarded(lambda: self.executor.execute_model(sched),
                               lambda: self.scheduler.fail_step(sched))
        t2 = self.clock()
        updated = self._guarded(lambda: self.scheduler.update_from_output(sched, result),
                                self.scheduler.fail_all)
        stats = self._make_stats(sched, self.scheduler.events, updated, result, t1 - t0, t2 - t1,
                                 self.clock() - t2)
        self.step_count += 1
        self._check_progress(sched)
        return EngineCoreOutputs(self._outputs(updated, result), stats)

    # -- outputs -------------------------------------------------------------------------------
    def _outputs(
        self, updated: list[Request], result: ModelRunnerOutput,
        scheduled: dict[str, Request] | None = None,
    ) -> list[EngineCoreOutput]:
        """An output per request that got a token, and the prompt logprobs of partial
        prefills of requests still live (`scheduled`: the step's requests, by id)."""
        outs = []
        for req in updated:
            tokens = result.sampled_token_ids[req.request_id]
            if req.is_finished:
                outs.append(self._final(req, tokens, result))
            else:
                outs.append(EngineCoreOutput(
                    req.request_id, tokens, result.logprobs.get(req.request_id),
                    result.prompt_logprobs.get(req.request_id),
                    num_cached_tokens=max(req.num_cached_tokens, 0)))
        got_token = {r.request_id for r in updated}
        if scheduled is None:
            scheduled = self.scheduler.requests
        for rid, lp in result.prompt_logprobs.items():  # partial prefills of logprob requests
            req = scheduled.get(rid)
            if rid not in got_token and req is not None and not req.is_finished:
                outs.append(EngineCoreOutput(rid, [], new_prompt_logprobs=lp))
        return outs

    def _final(
        self, req: Request, new_token_ids: list[int], result: ModelRunnerOutput | None = None,
    ) -> EngineCoreOutput:
        rid = req.request_id
        return EngineCoreOutput(
            rid, new_token_ids,
            None if result is None else result.logprobs.get(rid),
            None if result is None else result.prompt_logprobs.get(rid),
            finish_reason=req.finish_reason, stop_reason=req.stop_reason,
            num_cached_tokens=max(req.num_cached_tokens, 0),
            stats=RequestStats.from_request(req, self.origin))

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

    def take_failed(self) -> list[EngineCoreOutput]:
        """The final outputs of requests failed by steps that raised since the last call."""
        failed, self._failed = self._failed, []
        return [self._final(r, []) for r in failed]

    def _make_stats(
        self, sched, events: StepEvents, updated: list[Request], result: ModelRunnerOutput,
        t_sched: float, t_exec: float,
        t_update: float,
    ) -> StepStats:
        st = self.scheduler.stats()
        ev, kv = events, st.kv
        spec = self.scheduler.spec_counts  # of the update just made
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
            scheduled_req_ids=list(sched.num_scheduled_tokens),
            queue_policy=st.queue_policy,
            preemption_strategy=st.preemption_strategy,
            num_preempted=ev.num_preempted,
            preempted_by_strategy=dict(ev.preempted_by_strategy),
            kv_cache_usage=kv.usage,
            kv_blocks_used=kv.num_used_blocks,
            kv_blocks_total=kv.num_blocks,
            prefix_cache_queries=kv.prefix.queries,
            prefix_cache_hits=kv.prefix.hits,
            num_evicted_blocks=kv.num_evicted_blocks,
            kv_blocks_used_per_group=list(kv.group_used_blocks),
            num_window_freed_blocks=kv.num_window_freed_blocks,
            swap_out_blocks=ev.swap_out_blocks,
            swap_in_blocks=ev.swap_in_blocks,
            swap_out_bytes=ev.swap_out_blocks * kv.bytes_per_block,
            swap_in_bytes=ev.swap_in_blocks * kv.bytes_per_block,
            num_swap_fallbacks=ev.num_swap_fallbacks,
            swap_in_cached_blocks=ev.swap_in_cached_blocks,
            num_finished=sum(r.is_finished for r in updated),
            num_generated_tokens=sum(len(result.sampled_token_ids[r.request_id])
                                     for r in updated),
            num_spec_reqs=spec.num_spec_reqs,
            num_draft_tokens=spec.num_draft_tokens,
            num_accepted_tokens=spec.num_accepted_tokens,
            accepted_per_position=list(spec.accepted_per_position),
            num_prefill_reqs=sched.shape.num_prefill_reqs,
            num_decode_reqs=sched.shape.num_decode_reqs,
            prefill_attention_pairs=sched.shape.prefill_attention_pairs,
            decode_context_tokens=sched.shape.decode_context_tokens,
            prefill_chunks=[list(c) for c in sched.shape.prefill_chunks],
            max_query_len=sched.shape.max_query_len,
            max_context_len=sched.shape.max_context_len,
            num_sampled_reqs=sched.shape.num_sampled_reqs,
            num_new_reqs=sched.shape.num_new_reqs,
            schedule_time=t_sched,
            execute_time=t_exec,
            update_time=t_update,
        )
