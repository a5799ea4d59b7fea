"""The records of one engine step and of one finished request (names follow vLLM V1 so results
line up). Plain data: the engine core builds them, they cross to the frontend with the outputs
(lab.core.protocol), and every StatLogger (lab.metrics) receives them.

All `*_time` fields are seconds since engine start (the `origin` passed to `from_request`);
durations (ttft, tpot, itl, e2e_latency, queue_time, time_preempted, schedule/execute time)
are seconds.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lab.core.request import Request


@dataclass
class StepStats:
    """What one engine step did: queue sizes, token split, KV cache and preemption events."""

    step: int = 0
    time: float = 0.0  # seconds since engine start, at the end of the step
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_swapped_reqs: int = 0
    num_scheduled_tokens: int = 0
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_scheduled_reqs: int = 0
    # the requests scheduled in the step, in the scheduler's order (running, then admitted)
    scheduled_req_ids: list[str] = field(default_factory=list)
    queue_policy: str = ""  # the `scheduler` group's policy (RequestQueue), by name
    preemption_strategy: str = ""  # the `preemption` group's strategy, by name
    num_preempted: int = 0  # this step
    preempted_by_strategy: dict[str, int] = field(default_factory=dict)
    kv_cache_usage: float = 0.0  # 0..1
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    prefix_cache_queries: int = 0  # tokens looked up this step
    prefix_cache_hits: int = 0  # tokens found this step
    num_evicted_blocks: int = 0
    # per KV cache group (one for most models; a hybrid model's full-attention groups first):
    # its blocks in use after the step (lab/cache/groups.py)
    kv_blocks_used_per_group: list[int] = field(default_factory=list)
    num_window_freed_blocks: int = 0  # this step: blocks freed as they left a sliding window
    swap_out_blocks: int = 0
    swap_in_blocks: int = 0
    swap_out_bytes: int = 0
    swap_in_bytes: int = 0
    num_swap_fallbacks: int = 0  # swap victims recomputed because the swap space was full
    swap_in_cached_blocks: int = 0  # swapped blocks a resume found still on the device (no copy)
    num_finished: int = 0
    num_generated_tokens: int = 0  # tokens emitted this step (accepted drafts included)
    # speculative decoding (lab/speculative; vLLM's spec_decode metrics): requests that
    # verified drafts, drafts verified, drafts accepted, and accepted at each draft position
    num_spec_reqs: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    # the step's shape (lab.core.step.StepShape): what step-time models fit and predict
    num_prefill_reqs: int = 0  # prefill chunks (prompt or recomputed tokens)
    num_decode_reqs: int = 0  # requests computing their one last token
    prefill_attention_pairs: int = 0  # causal query-key pairs of the prefill chunks
    decode_context_tokens: int = 0  # keys the decodes read
    prefill_chunks: list[list[int]] = field(default_factory=list)  # [q, c] per prefill chunk
    max_query_len: int = 0
    max_context_len: int = 0  # max over the step's requests of computed + new tokens
    num_sampled_reqs: int = 0  # requests that sample a token this step
    num_new_reqs: int = 0  # admitted or resumed this step
    schedule_time: float = 0.0
    execute_time: float = 0.0
    update_time: float = 0.0  # update_from_output: tokens appended, stop checks, frees

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RequestStats:
    """The life of one finished request: event times, latencies and token counts."""

    request_id: str
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    ttft: float | None = None
    tpot: float | None = None  # (last_token - first_token) / (n_output - 1); None if n < 2
    itl: list[float] = field(default_factory=list)  # between steps that emitted tokens
    e2e_latency: float | None = None
    queue_time: float | None = None  # first scheduled - arrival
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    num_draft_tokens: int = 0  # speculative decoding: drafts verified, and accepted
    num_accepted_tokens: int = 0
    time_preempted: float = 0.0  # preempted (recompute or swapped) until resumed, summed
    time_swapped: float = 0.0  # of which with the KV blocks parked in the swap space
    priority: int = 0
    client_id: str | None = None
    finish_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_request(
        cls, req: Request, origin: float = 0.0, now: float | None = None
    ) -> RequestStats:
        """Build from a (finished) Request.

        `req.times` holds time.perf_counter stamps; `origin` is the engine's start stamp, so
        `*_time` fields come out as seconds since start. `now` stands in for a missing finish
        stamp (default: the last token's stamp, else time.perf_counter()).
        """
        t = req.times
        last = t.last_token if t.last_token is not None else (t.token_times or [None])[-1]
        finish = _first_set(t.finished, now, last, time.perf_counter())
        n_out = req.num_output_tokens
        decode = _diff(last, t.first_token)
        return cls(
            request_id=req.request_id,
            arrival_time=t.arrival - origin,
            first_scheduled_time=_rel(t.first_scheduled, origin),
            first_token_time=_rel(t.first_token, origin),
            finish_time=finish - origin,
            ttft=_diff(t.first_token, t.arrival),
            tpot=decode / (n_out - 1) if n_out >= 2 and decode is not None else None,
            itl=[b - a for a, b in zip(t.token_times, t.token_times[1:])],
            e2e_latency=finish - t.arrival,
            queue_time=_diff(t.first_scheduled, t.arrival),
            num_prompt_tokens=req.num_prompt_tokens,
            num_output_tokens=n_out,
            num_cached_tokens=max(req.num_cached_tokens, 0),
            num_preemptions=req.num_preemptions,
            num_draft_tokens=req.num_draft_tokens,
            num_accepted_tokens=req.num_accepted_tokens,
            time_preempted=t.time_preempted,
            time_swapped=t.time_swapped,
            priority=req.priority,
            client_id=req.client_id,
            finish_reason=req.finish_reason,
        )


def _first_set(*values: float | None) -> float:
    return next(v for v in values if v is not None)


def _rel(t: float | None, origin: float) -> float | None:
    return None if t is None else t - origin


def _diff(later: float | None, earlier: float | None) -> float | None:
    return None if later is None or earlier is None else later - earlier
