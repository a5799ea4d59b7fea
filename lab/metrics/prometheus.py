"""PrometheusLogger: vLLM's Prometheus metrics, under a `lab:` prefix, in a registry of its own.

    python run.py logger=[console,jsonl,prometheus]                        # writes metrics.prom
    python run.py logger=[console,prometheus] logger.prometheus.port=9400  # + serves /metrics

Built from the same StepStats / RequestStats records as every logger; the names follow vLLM V1
(`vllm:` -> `lab:`) so dashboards carry over. The registry is a `CollectorRegistry` owned by the
logger (`logger.registry`, or `exposition()` for the text format), never the global one, so an
OpenAI-compatible server can expose it and two engines in a process do not collide.

    gauges      lab:num_requests_running, lab:num_requests_waiting, lab:num_requests_swapped,
                lab:kv_cache_usage_perc (a fraction 0..1, as in vLLM)
    counters    lab:prefix_cache_queries, lab:prefix_cache_hits (tokens), lab:num_preemptions,
                lab:prompt_tokens, lab:generation_tokens, lab:request_success{finished_reason},
                lab:spec_decode_num_drafts, lab:spec_decode_num_draft_tokens,
                lab:spec_decode_num_accepted_tokens,
                lab:spec_decode_num_accepted_tokens_per_pos{position}
                (exposed with the `_total` suffix)
    histograms  lab:time_to_first_token_seconds, lab:time_per_output_token_seconds,
                lab:inter_token_latency_seconds, lab:e2e_request_latency_seconds,
                lab:request_queue_time_seconds, lab:request_prompt_tokens,
                lab:request_generation_tokens, lab:iteration_tokens_total
Every metric has the label `model_name`. Latency buckets are vLLM's, with finer ones below
10 ms for TPOT / ITL (small models on a CPU decode in milliseconds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import start_http_server, write_to_textfile

from lab.core.protocol import CoreStatus
from lab.core.stats import RequestStats, StepStats
from lab.metrics.base import StatLogger
from lab.metrics.stats import RunSummary

PREFIX = "lab:"
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                         0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_COUNT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000,
                       50000, 100000)


class LabMetrics:
    """The metric objects, registered in `registry` and labelled with one model name."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        def make(kind, name: str, doc: str, extra_labels=(), **kw):
            metric = kind(PREFIX + name, doc, ["model_name", *extra_labels], registry=registry,
                          **kw)
            return metric if extra_labels else metric.labels(model_name)

        self.running = make(Gauge, "num_requests_running", "Requests in the running batch.")
        self.waiting = make(Gauge, "num_requests_waiting", "Requests waiting to be scheduled.")
        self.swapped = make(Gauge, "num_requests_swapped", "Requests with KV blocks swapped out.")
        self.kv_usage = make(Gauge, "kv_cache_usage_perc", "KV-cache usage (1 = full).")
        self.prefix_queries = make(Counter, "prefix_cache_queries", "Prefix-cache tokens queried.")
        self.prefix_hits = make(Counter, "prefix_cache_hits", "Prefix-cache tokens hit.")
        self.preemptions = make(Counter, "num_preemptions", "Requests preempted.")
        self.prompt_tokens = make(Counter, "prompt_tokens", "Prefill tokens processed.")
        self.generation_tokens = make(Counter, "generation_tokens", "Tokens generated.")
        self._success = make(Counter, "request_success", "Finished requests.", ["finished_reason"])
        self.spec_drafts = make(Counter, "spec_decode_num_drafts",
                                "Speculative verifications (a request's step with drafts).")
        self.spec_draft_tokens = make(Counter, "spec_decode_num_draft_tokens",
                                      "Draft tokens verified.")
        self.spec_accepted = make(Counter, "spec_decode_num_accepted_tokens",
                                  "Draft tokens accepted.")
        self._spec_per_pos = make(Counter, "spec_decode_num_accepted_tokens_per_pos",
                                  "Draft tokens accepted at each draft position.", ["position"])
        self.model_name = model_name
        hist = {"ttft": ("time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS),
                "tpot": ("time_per_output_token_seconds", "Time per output token after the "
                         "first (per request).", TOKEN_LATENCY_BUCKETS),
                "itl": ("inter_token_latency_seconds", "Time between consecutive tokens.",
                        TOKEN_LATENCY_BUCKETS),
                "e2e": ("e2e_request_latency_seconds", "Arrival to last token.",
                        REQUEST_LATENCY_BUCKETS),
                "queue": ("request_queue_time_seconds", "Arrival to first scheduled.",
                          REQUEST_LATENCY_BUCKETS),
                "prompt_len": ("request_prompt_tokens", "Prompt tokens per request.",
                               TOKEN_COUNT_BUCKETS),
                "output_len": ("request_generation_tokens", "Generated tokens per request.",
                               TOKEN_COUNT_BUCKETS),
                "iteration": ("iteration_tokens_total", "Tokens scheduled per engine step.",
                              TOKEN_COUNT_BUCKETS)}
        self.hist = {key: make(Histogram, name, doc, buckets=buckets)
                     for key, (name, doc, buckets) in hist.items()}

    def observe_status(self, s: CoreStatus) -> None:
        """The scheduler gauges from the core's state now: a step's stats leave them as they
        were at that step, stale once requests were aborted and no step ran since."""
        self.running.set(s.num_running)
        self.waiting.set(s.num_waiting)
        self.swapped.set(s.num_swapped_reqs)
        self.kv_usage.set(s.num_used_blocks / s.num_blocks if s.num_blocks else 0.0)

    def observe_step(self, s: StepStats) -> None:
        self.running.set(s.num_running_reqs)
        self.waiting.set(s.num_waiting_reqs)
        self.swapped.set(s.num_swapped_reqs)
        self.kv_usage.set(s.kv_cache_usage)
        self.prefix_queries.inc(s.prefix_cache_queries)
        self.prefix_hits.inc(s.prefix_cache_hits)
        self.preemptions.inc(s.num_preempted)
        self.prompt_tokens.inc(s.num_prefill_tokens)
        self.generation_tokens.inc(s.num_generated_tokens)
        if s.num_spec_reqs:
            self.spec_drafts.inc(s.num_spec_reqs)
            self.spec_draft_tokens.inc(s.num_draft_tokens)
            self.spec_accepted.inc(s.num_accepted_tokens)
            for position, n in enumerate(s.accepted_per_position):
                self._spec_per_pos.labels(self.model_name, str(position)).inc(n)
        if s.num_scheduled_tokens > 0:
            self.hist["iteration"].observe(s.num_scheduled_tokens)

    def observe_request(self, r: RequestStats) -> None:
        self._success.labels(self.model_name, r.finish_reason or "unknown").inc()
        for key, value in (("ttft", r.ttft), ("tpot", r.tpot), ("e2e", r.e2e_latency),
                           ("queue", r.queue_time)):
            if value is not None:
                self.hist[key].observe(value)
        for gap in r.itl:
            self.hist["itl"].observe(gap)
        self.hist["prompt_len"].observe(r.num_prompt_tokens)
        self.hist["output_len"].observe(r.num_output_tokens)


class PrometheusLogger(StatLogger):
    """Keeps the `lab:` metrics up to date; optionally serves them and writes a textfile."""

    def __init__(self, model_name: str | None = None, textfile: str | None = "metrics.prom",
                 port: int | None = None, addr: str = "127.0.0.1") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._model_name = model_name
        self.metrics: LabMetrics | None = None
        self.textfile, self.port, self.addr = textfile, port, addr
        self.run_dir: Path | None = None
        self._server: Any = None

    def on_start(self, run_dir: Path, config=None, total_requests=None) -> None:
        super().on_start(run_dir, config, total_requests)
        self._ensure_metrics()
        if self.port is not None and self._server is None:
            self._server, _ = start_http_server(self.port, self.addr, registry=self.registry)

    @property
    def server_port(self) -> int | None:
        """The port /metrics is served on (the real one when `port=0` asked for any)."""
        return None if self._server is None else self._server.server_port

    def on_step(self, stats: StepStats) -> None:
        self._ensure_metrics().observe_step(stats)

    def on_request(self, stats: RequestStats) -> None:
        self._ensure_metrics().observe_request(stats)

    def on_status(self, status: CoreStatus) -> None:
        """The core's state now (a server asks for it before each scrape)."""
        self._ensure_metrics().observe_status(status)

    def close(self, summary: RunSummary) -> None:
        if self.textfile and self.run_dir is not None:
            write_to_textfile(str(self.run_dir / self.textfile), self.registry)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def exposition(self) -> str:
        """The Prometheus text format of every metric, as served on /metrics (every `lab:`
        metric is declared, with zeros, before the first step)."""
        self._ensure_metrics()
        return generate_latest(self.registry).decode()

    def _ensure_metrics(self) -> LabMetrics:
        if self.metrics is None:
            name = self._model_name or model_name_of(getattr(self, "config", None))
            self.metrics = LabMetrics(self.registry, name)
        return self.metrics


def model_name_of(config: dict[str, Any] | None) -> str:
    """The model's preset name or checkpoint path from a resolved config ('lab' if neither)."""
    model = (config or {}).get("model") or {}
    return str(model.get("name") or model.get("path") or "lab")
