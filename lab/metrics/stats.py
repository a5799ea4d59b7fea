"""Per-step and per-request statistics (names follow vLLM V1 so results line up).

All `*_time` fields are seconds since engine start (the `origin` passed to `from_request`);
durations (ttft, tpot, itl, e2e_latency, queue_time, time_preempted, schedule/execute time)
are seconds.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from lab.engine.request import Request


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
    num_preempted: int = 0  # this step
    preempted_by_strategy: dict[str, int] = field(default_factory=dict)
    kv_cache_usage: float = 0.0  # 0..1
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    prefix_cache_queries: int = 0  # tokens looked up this step
    prefix_cache_hits: int = 0  # tokens found this step
    num_evicted_blocks: int = 0
    swap_out_blocks: int = 0
    swap_in_blocks: int = 0
    swap_out_bytes: int = 0
    swap_in_bytes: int = 0
    num_swap_fallbacks: int = 0  # swap victims recomputed because the swap space was full
    swap_in_cached_blocks: int = 0  # swapped blocks a resume found still on the device (no copy)
    num_finished: int = 0
    num_generated_tokens: int = 0  # tokens sampled this step
    # the step's shape (lab.scheduler.output.StepShape): what step-time models fit and predict
    num_prefill_reqs: int = 0  # prefill chunks (prompt or recomputed tokens)
    num_decode_reqs: int = 0  # requests computing their one last token
    prefill_attention_pairs: int = 0  # causal query-key pairs of the prefill chunks
    decode_context_tokens: int = 0  # keys the decodes read
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
    itl: list[float] = field(default_factory=list)
    e2e_latency: float | None = None
    queue_time: float | None = None  # first scheduled - arrival
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
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


_PCTS = (50, 90, 99)
_LATENCIES = ("ttft", "tpot", "itl", "e2e")


@dataclass
class RunSummary:
    """Aggregates of a run. Latencies in seconds; percentiles interpolate linearly (numpy)."""

    status: str = "finished"  # run.py writes {"status": "failed", "stage", "error"} for a failed run
    num_requests: int = 0  # finished requests (aborted ones included)
    num_rejected: int = 0  # requests the engine refused at admission (e.g. too long)
    num_kv_blocks: int = 0  # usable KV blocks of the run (the null block excluded)
    kv_block_size: int = 0  # tokens per block
    kv_bytes_per_token: int = 0  # KV-cache bytes one token takes over all layers
    weight_bytes: int = 0  # model parameters as stored (after quantization)
    num_finished: dict[str, int] = field(default_factory=dict)  # by finish reason
    total_prompt_tokens: int = 0
    total_output_tokens: int = 0
    total_cached_tokens: int = 0
    wall_time: float = 0.0
    output_throughput: float | None = None  # output tok/s over wall time
    total_throughput: float | None = None  # (prompt + output) tok/s over wall time
    request_throughput: float | None = None  # requests/s over wall time
    ttft_mean: float | None = None
    ttft_p50: float | None = None
    ttft_p90: float | None = None
    ttft_p99: float | None = None
    tpot_mean: float | None = None
    tpot_p50: float | None = None
    tpot_p90: float | None = None
    tpot_p99: float | None = None
    itl_mean: float | None = None
    itl_p50: float | None = None
    itl_p90: float | None = None
    itl_p99: float | None = None
    e2e_mean: float | None = None
    e2e_p50: float | None = None
    e2e_p90: float | None = None
    e2e_p99: float | None = None
    # TTFT of each priority class present: {"0": {"count", "mean", "p50", "p90", "p99"}, ...}
    # (keys are the priorities as strings, as JSON has them; lower is served first)
    ttft_by_priority: dict[str, dict[str, float | int | None]] = field(default_factory=dict)
    peak_kv_cache_usage: float | None = None
    mean_kv_cache_usage: float | None = None
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_hit_rate: float | None = None  # sum(hits) / sum(queries)
    num_preemptions: int = 0
    preempted_by_strategy: dict[str, int] = field(default_factory=dict)
    num_evicted_blocks: int = 0
    swap_out_blocks: int = 0
    swap_in_blocks: int = 0
    swap_out_bytes: int = 0
    swap_in_bytes: int = 0
    num_swap_fallbacks: int = 0
    num_steps: int = 0
    mean_batch_size: float | None = None  # scheduled requests per step that scheduled any
    slo_ttft_s: float | None = None  # the SLO bounds goodput was measured against (None: none)
    slo_tpot_s: float | None = None
    slo_e2e_s: float | None = None
    num_good_requests: int = 0  # finished requests that met every SLO bound
    slo_attainment: float | None = None  # num_good_requests / num_requests
    request_goodput: float | None = None  # num_good_requests / wall_time (req/s)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SLO:
    """Latency bounds for goodput (DistServe): a request is *good* when it finished normally
    (stop or length) and meets every bound; None means no bound on that latency.

    TTFT and E2E compare with the request's own values; TPOT too, except that a request with a
    single output token has no TPOT and so meets any TPOT bound. With no bound at all, every
    normally finished request is good (goodput = request throughput less aborted requests).
    """

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or v <= 0):
                raise ValueError(f"slo.{f.name}={v!r} must be a positive number of seconds or null")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> SLO:
        """From the `slo:` block of conf/config.yaml (a mapping; missing or None: no bounds)."""
        cfg = dict(cfg or {})
        unknown = sorted(set(cfg) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown slo keys {unknown}: use ttft_s, tpot_s, e2e_s")
        return cls(**cfg)

    def is_met_by(self, r: RequestStats) -> bool:
        if r.finish_reason not in ("stop", "length"):
            return False
        return (_within(r.ttft, self.ttft_s, missing_ok=False)
                and _within(r.tpot, self.tpot_s, missing_ok=True)
                and _within(r.e2e_latency, self.e2e_s, missing_ok=False))


def _within(value: float | None, bound: float | None, missing_ok: bool) -> bool:
    if bound is None:
        return True
    return missing_ok if value is None else value <= bound


def summarize(
    steps: Sequence[StepStats], requests: Sequence[RequestStats], wall_time: float,
    slo: SLO | None = None,
) -> RunSummary:
    """Aggregate step and finished-request records of a run of `wall_time` seconds; goodput
    counts the requests that meet `slo` (default: no bounds)."""
    s = RunSummary(num_requests=len(requests), wall_time=wall_time, num_steps=len(steps))
    _fill_requests(s, requests)
    _fill_steps(s, steps, requests)
    _fill_goodput(s, requests, slo if slo is not None else SLO())
    return s


def _fill_goodput(s: RunSummary, requests: Sequence[RequestStats], slo: SLO) -> None:
    s.slo_ttft_s, s.slo_tpot_s, s.slo_e2e_s = slo.ttft_s, slo.tpot_s, slo.e2e_s
    s.num_good_requests = sum(slo.is_met_by(r) for r in requests)
    if requests:
        s.slo_attainment = s.num_good_requests / len(requests)
    if s.wall_time > 0:
        s.request_goodput = s.num_good_requests / s.wall_time


def _fill_requests(s: RunSummary, requests: Sequence[RequestStats]) -> None:
    s.num_finished = dict(Counter(r.finish_reason or "unknown" for r in requests))
    s.total_prompt_tokens = sum(r.num_prompt_tokens for r in requests)
    s.total_output_tokens = sum(r.num_output_tokens for r in requests)
    s.total_cached_tokens = sum(r.num_cached_tokens for r in requests)
    if s.wall_time > 0:
        s.output_throughput = s.total_output_tokens / s.wall_time
        s.total_throughput = (s.total_prompt_tokens + s.total_output_tokens) / s.wall_time
        s.request_throughput = len(requests) / s.wall_time
    values = {
        "ttft": [r.ttft for r in requests if r.ttft is not None],
        "tpot": [r.tpot for r in requests if r.tpot is not None],
        "itl": [x for r in requests for x in r.itl],
        "e2e": [r.e2e_latency for r in requests if r.e2e_latency is not None],
    }
    for name in _LATENCIES:
        for key, val in _describe(values[name]).items():
            setattr(s, f"{name}_{key}", val)
    s.ttft_by_priority = ttft_by_priority(requests)


def ttft_by_priority(requests: Sequence[RequestStats]) -> dict[str, dict[str, float | int | None]]:
    """{priority: {count, mean, p50, p90, p99}} of the TTFTs of each priority class, in priority
    order; `count` is the requests of the class (those without a first token add no TTFT)."""
    out: dict[str, dict[str, float | int | None]] = {}
    for prio in sorted({r.priority for r in requests}):
        mine = [r for r in requests if r.priority == prio]
        out[str(prio)] = {"count": len(mine),
                          **_describe([r.ttft for r in mine if r.ttft is not None])}
    return out


def _fill_steps(
    s: RunSummary, steps: Sequence[StepStats], requests: Sequence[RequestStats]
) -> None:
    if steps:
        usage = [st.kv_cache_usage for st in steps]
        s.peak_kv_cache_usage, s.mean_kv_cache_usage = max(usage), float(np.mean(usage))
    s.prefix_cache_queries = sum(st.prefix_cache_queries for st in steps)
    s.prefix_cache_hits = sum(st.prefix_cache_hits for st in steps)
    if s.prefix_cache_queries > 0:
        s.prefix_cache_hit_rate = s.prefix_cache_hits / s.prefix_cache_queries
    # Steps see every preemption; finished requests only their own (the fallback without steps).
    s.num_preemptions = (
        sum(st.num_preempted for st in steps) if steps
        else sum(r.num_preemptions for r in requests)
    )
    by_strategy: Counter[str] = Counter()
    for st in steps:
        by_strategy.update(st.preempted_by_strategy)
    s.preempted_by_strategy = dict(by_strategy)
    s.num_evicted_blocks = sum(st.num_evicted_blocks for st in steps)
    s.swap_out_blocks = sum(st.swap_out_blocks for st in steps)
    s.swap_in_blocks = sum(st.swap_in_blocks for st in steps)
    s.swap_out_bytes = sum(st.swap_out_bytes for st in steps)
    s.swap_in_bytes = sum(st.swap_in_bytes for st in steps)
    s.num_swap_fallbacks = sum(st.num_swap_fallbacks for st in steps)
    batches = [st.num_scheduled_reqs for st in steps if st.num_scheduled_reqs > 0]
    s.mean_batch_size = float(np.mean(batches)) if batches else None


def _describe(values: list[float]) -> dict[str, float | None]:
    """mean and p50/p90/p99 of `values` (all None when empty)."""
    if not values:
        return {"mean": None, **{f"p{p}": None for p in _PCTS}}
    arr = np.asarray(values, dtype=np.float64)
    out: dict[str, float | None] = {"mean": float(arr.mean())}
    for p, v in zip(_PCTS, np.percentile(arr, _PCTS)):
        out[f"p{p}"] = float(v)
    return out
