"""A run's statistics from its step and request records (lab.core.stats): the RunSummary,
latency percentiles, goodput under SLOs (names follow vLLM V1 so results line up)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from lab.core.stats import RequestStats, StepStats

_PCTS = (50, 90, 99)
_LATENCIES = ("ttft", "tpot", "itl", "e2e")


@dataclass
class RunSummary:
    """Aggregates of a run. Latencies in seconds; percentiles interpolate linearly (numpy)."""

    status: str = "finished"  # run.py writes {"status": "failed", "stage", "error"} for a failed run
    # what ran: model, dtype, device, attention, kernels, quant, scheduler, preemption, executor,
    # engine_client, threads, commit (lab/engine/replay.py run_setup)
    setup: dict[str, str] = field(default_factory=dict)
    num_requests: int = 0  # finished requests (aborted ones included)
    num_rejected: int = 0  # requests the engine refused at admission (e.g. too long)
    num_kv_blocks: int = 0  # usable KV blocks of the run (the null block excluded)
    kv_block_size: int = 0  # tokens per block
    # a block's bytes / block_size: one token in each KV tensor, i.e. over all layers when the
    # model has one KV cache group, over one group's layers when it has several
    kv_bytes_per_token: int = 0
    # the KV cache groups (lab/cache/groups.py), e.g. ["full_attention", "sliding_window(16)"]
    kv_cache_groups: list[str] = field(default_factory=list)
    weight_bytes: int = 0  # model parameters as stored (after quantization)
    num_finished: dict[str, int] = field(default_factory=dict)  # by finish reason
    total_prompt_tokens: int = 0
    total_output_tokens: int = 0
    total_cached_tokens: int = 0
    wall_time: float = 0.0  # of the run's clock: simulated seconds under executor=sim
    timing: str = "wall clock"  # what the times are (Executor.timing: wall, or which sim model)
    # the warm-up before the run's clock started (lab/engine/warmup.py; not in wall_time, nor in
    # any other field): its seconds and steps; None / 0 when none ran (warmup=false, executor=sim)
    warmup_seconds: float | None = None
    warmup_steps: int = 0
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
    num_window_freed_blocks: int = 0  # blocks freed as they left a sliding window
    swap_out_blocks: int = 0
    swap_in_blocks: int = 0
    swap_out_bytes: int = 0
    swap_in_bytes: int = 0
    num_swap_fallbacks: int = 0
    # speculative decoding (lab/speculative; vLLM's spec-decode metrics): verifications (a
    # request's step with drafts), drafts verified and accepted, accepted / drafted, the mean
    # tokens a verification emits (1 + accepted / verifications) and the acceptance rate at each
    # draft position (accepted there / verifications); None / [] without drafts
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_acceptance_rate: float | None = None
    spec_mean_acceptance_length: float | None = None
    spec_acceptance_per_position: list[float] = field(default_factory=list)
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
        """From the `slo:` block of lab/conf/config.yaml (a mapping; missing or None: no bounds)."""
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
    s.num_window_freed_blocks = sum(st.num_window_freed_blocks for st in steps)
    s.swap_out_blocks = sum(st.swap_out_blocks for st in steps)
    s.swap_in_blocks = sum(st.swap_in_blocks for st in steps)
    s.swap_out_bytes = sum(st.swap_out_bytes for st in steps)
    s.swap_in_bytes = sum(st.swap_in_bytes for st in steps)
    s.num_swap_fallbacks = sum(st.num_swap_fallbacks for st in steps)
    batches = [st.num_scheduled_reqs for st in steps if st.num_scheduled_reqs > 0]
    s.mean_batch_size = float(np.mean(batches)) if batches else None
    _fill_spec(s, steps)


def _fill_spec(s: RunSummary, steps: Sequence[StepStats]) -> None:
    """Speculative decoding's totals and rates (RunSummary's spec_* fields)."""
    s.spec_num_drafts = sum(st.num_spec_reqs for st in steps)
    s.spec_num_draft_tokens = sum(st.num_draft_tokens for st in steps)
    s.spec_num_accepted_tokens = sum(st.num_accepted_tokens for st in steps)
    if not s.spec_num_drafts:
        return
    s.spec_acceptance_rate = s.spec_num_accepted_tokens / max(s.spec_num_draft_tokens, 1)
    s.spec_mean_acceptance_length = 1 + s.spec_num_accepted_tokens / s.spec_num_drafts
    per_position = [0] * max(len(st.accepted_per_position) for st in steps)
    for st in steps:
        for j, n in enumerate(st.accepted_per_position):
            per_position[j] += n
    s.spec_acceptance_per_position = [n / s.spec_num_drafts for n in per_position]


def _describe(values: list[float]) -> dict[str, float | None]:
    """mean and p50/p90/p99 of `values` (all None when empty)."""
    if not values:
        return {"mean": None, **{f"p{p}": None for p in _PCTS}}
    arr = np.asarray(values, dtype=np.float64)
    out: dict[str, float | None] = {"mean": float(arr.mean())}
    for p, v in zip(_PCTS, np.percentile(arr, _PCTS)):
        out[f"p{p}"] = float(v)
    return out
