"""ConsoleLogger: a progress bar, a periodic vLLM-like stats line, and a summary table at close.

The stats line (every `interval_s` seconds of engine time, measured with `StepStats.time`):

    Avg prompt throughput: 812.3 tokens/s, Avg generation throughput: 95.0 tokens/s,
    Running: 12 reqs, Waiting: 40 reqs, KV cache usage: 37.5%, Prefix cache hit rate: 21.0%,
    Preemptions: 3

Throughputs are over the interval; the hit rate and preemptions are totals since the start.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rich.console import Console
from rich.table import Table
from tqdm.auto import tqdm

from lab.core.stats import RequestStats, StepStats
from lab.metrics.base import StatLogger
from lab.metrics.stats import RunSummary

logger = logging.getLogger(__name__)


class ConsoleLogger(StatLogger):
    """Human-readable progress: tqdm bar over finished requests, stats lines, rich summary."""

    def __init__(self, interval_s: float = 5.0, progress: bool = True) -> None:
        if not isinstance(interval_s, int | float) or interval_s < 0:
            raise ValueError(f"ConsoleLogger.interval_s={interval_s!r} must be a number >= 0")
        self.interval_s = float(interval_s)
        self.progress = bool(progress)
        self.run_dir: Path | None = None
        self._total: int | None = None
        self._bar: tqdm | None = None
        self._last_log_time = 0.0
        self._prompt_tokens = 0  # since the last line
        self._gen_tokens = 0  # since the last line
        self._queries = 0  # since the start
        self._hits = 0
        self._preemptions = 0
        self._spec = [0, 0, 0]  # since the last line: verifications, drafts, accepted

    # -- StatLogger ----------------------------------------------------------------------------
    def on_start(self, run_dir: Path, config=None, total_requests=None) -> None:
        super().on_start(run_dir, config, total_requests)
        self._ensure_bar()

    def set_total(self, n: int) -> None:
        self._total = n
        if self._bar is not None:
            self._bar.total = n
            self._bar.refresh()

    def on_step(self, stats: StepStats) -> None:
        self._ensure_bar()
        self._prompt_tokens += stats.num_prefill_tokens
        self._gen_tokens += stats.num_generated_tokens
        self._queries += stats.prefix_cache_queries
        self._hits += stats.prefix_cache_hits
        self._preemptions += stats.num_preempted
        self._spec = [self._spec[0] + stats.num_spec_reqs, self._spec[1] + stats.num_draft_tokens,
                      self._spec[2] + stats.num_accepted_tokens]
        if self._bar is not None and not self._bar.disable:
            self._bar.set_postfix(
                run=stats.num_running_reqs, wait=stats.num_waiting_reqs,
                kv=f"{100 * stats.kv_cache_usage:.0f}%", refresh=False,
            )
        elapsed = stats.time - self._last_log_time
        if elapsed >= self.interval_s and elapsed > 0:
            self._emit(self.format_line(stats, elapsed))
            self._last_log_time = stats.time
            self._prompt_tokens = self._gen_tokens = 0
            self._spec = [0, 0, 0]

    def on_request(self, stats: RequestStats) -> None:
        self._ensure_bar()
        if self._bar is not None:
            self._bar.update(1)

    def close(self, summary: RunSummary) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        console = Console()
        console.print(summary_table(summary))
        if self.run_dir is not None:
            console.print(
                f"run directory: {self.run_dir}", soft_wrap=True, markup=False, highlight=False
            )

    # -- helpers -------------------------------------------------------------------------------
    def format_line(self, stats: StepStats, elapsed: float) -> str:
        """The periodic stats line for the interval of `elapsed` seconds ending at `stats`."""
        hit_rate = 100 * self._hits / self._queries if self._queries else 0.0
        return (
            f"Avg prompt throughput: {self._prompt_tokens / elapsed:.1f} tokens/s, "
            f"Avg generation throughput: {self._gen_tokens / elapsed:.1f} tokens/s, "
            f"Running: {stats.num_running_reqs} reqs, Swapped: {stats.num_swapped_reqs} reqs, "
            f"Waiting: {stats.num_waiting_reqs} reqs, "
            f"KV cache usage: {100 * stats.kv_cache_usage:.1f}%, "
            f"Prefix cache hit rate: {hit_rate:.1f}%, Preemptions: {self._preemptions}"
            + spec_text(*self._spec)
        )

    def _ensure_bar(self) -> None:
        if self._bar is None:
            self._bar = tqdm(
                total=self._total, desc="requests", unit="req",
                disable=not self.progress, dynamic_ncols=True,
            )

    def _emit(self, line: str) -> None:
        if self._bar is not None and not self._bar.disable:
            self._bar.write(line)
        else:
            logger.info(line)


def summary_table(s: RunSummary) -> Table:
    """A two-column rich table of the headline numbers of a run."""
    table = Table(title="run summary", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    finished = ", ".join(f"{k}={v}" for k, v in sorted(s.num_finished.items())) or "-"
    rows = [
        *([("ran", setup_text(s.setup))] if s.setup else []),
        ("requests", f"{s.num_requests} ({finished})"
         + (f", {s.num_rejected} rejected" if s.num_rejected else "")),
        ("wall time" if s.timing == "wall clock" else "simulated time", f"{s.wall_time:.2f} s"
         + ("" if s.warmup_seconds is None else f" (after a {s.warmup_seconds:.2f} s warm-up)")),
        ("clock", s.timing),
        ("output tok/s", _num(s.output_throughput)),
        ("total tok/s", _num(s.total_throughput)),
        ("TTFT p50 / p99", f"{_ms(s.ttft_p50)} / {_ms(s.ttft_p99)} ms"),
        ("TPOT p50 / p99", f"{_ms(s.tpot_p50)} / {_ms(s.tpot_p99)} ms"),
        ("ITL p50 / p99", f"{_ms(s.itl_p50)} / {_ms(s.itl_p99)} ms"),
        ("E2E p50 / p99", f"{_ms(s.e2e_p50)} / {_ms(s.e2e_p99)} ms"),
        ("goodput (SLOs)", goodput_text(s)),
        ("weights", f"{s.weight_bytes / 2**20:.2f} MiB"),
        ("KV cache", f"{s.num_kv_blocks} blocks x {s.kv_block_size} tokens, "
         f"{s.kv_bytes_per_token} bytes/token" + kv_groups_text(s.kv_cache_groups)),
        ("peak KV usage", _pct(s.peak_kv_cache_usage)),
        ("prefix-cache hit rate", _pct(s.prefix_cache_hit_rate)),
        ("preemptions", str(s.num_preemptions)
         + "".join(f", {k}={v}" for k, v in sorted(s.preempted_by_strategy.items()))),
        ("swapped out / in", f"{s.swap_out_blocks} / {s.swap_in_blocks} blocks "
         f"({s.swap_out_bytes / 2**20:.1f} / {s.swap_in_bytes / 2**20:.1f} MiB), "
         f"{s.num_swap_fallbacks} fallbacks"),
        *([("speculative", spec_summary_text(s))] if s.spec_num_drafts else []),
        ("steps / mean batch", f"{s.num_steps} / {_num(s.mean_batch_size)}"),
    ]
    rows[5:5] = priority_rows(s)  # after the overall TTFT
    for name, value in rows:
        table.add_row(name, value)
    return table


def spec_text(verifications: int, drafts: int, accepted: int) -> str:
    """The periodic line's speculative part (vLLM's SpecDecoding metrics); '' without drafts."""
    if not verifications:
        return ""
    return (f", Spec decode: mean acceptance length {1 + accepted / verifications:.2f}, "
            f"accepted {accepted} / drafted {drafts} tokens "
            f"({100 * accepted / max(drafts, 1):.1f}%)")


def spec_summary_text(s: RunSummary) -> str:
    """acceptance rate, mean acceptance length and per-position rates of a run with drafts."""
    per_position = ", ".join(f"{r:.2f}" for r in s.spec_acceptance_per_position)
    return (f"{_pct(s.spec_acceptance_rate)} of {s.spec_num_draft_tokens} drafts accepted, "
            f"mean acceptance length {_num(s.spec_mean_acceptance_length)}, "
            f"per position {per_position}")


def priority_rows(s: RunSummary) -> list[tuple[str, str]]:
    """One 'TTFT priority P' row per priority class, when the run had more than one."""
    if len(s.ttft_by_priority) < 2:
        return []
    return [(f"  TTFT priority {p}", f"{_ms(d['p50'])} / {_ms(d['p99'])} ms, {d['count']} req")
            for p, d in s.ttft_by_priority.items()]


def setup_text(setup: dict[str, str]) -> str:
    """'tiny_llama float32 cpu, attention torch, kernels auto_ops, ..., commit abc' (RunSummary's
    setup, its model, dtype and device first)."""
    head = " ".join(setup.get(k, "") for k in ("model", "dtype", "device")).strip()
    rest = [f"{k} {v}" for k, v in setup.items() if k not in ("model", "dtype", "device")]
    return ", ".join([head, *rest])


def kv_groups_text(groups: list[str]) -> str:
    """', 2 groups: full_attention + sliding_window(16)' for a hybrid KV cache; '' for one group
    (its blocks hold every layer)."""
    return f", {len(groups)} groups: {' + '.join(groups)}" if len(groups) > 1 else ""


def goodput_text(s: RunSummary) -> str:
    """Goodput and SLO attainment against the run's bounds, or that no SLO was set."""
    if (s.slo_ttft_s, s.slo_tpot_s, s.slo_e2e_s) == (None, None, None):
        return "no SLO set (slo.ttft_s, slo.tpot_s, slo.e2e_s)"
    return f"{_num(s.request_goodput)} req/s, {_pct(s.slo_attainment)} met {slo_text(s)}"


def slo_text(s: RunSummary) -> str:
    """The SLO bounds of a summary, e.g. 'TTFT<=1000ms TPOT<=100ms' ('no bounds' when none)."""
    bounds = [(n, b) for n, b in (("TTFT", s.slo_ttft_s), ("TPOT", s.slo_tpot_s),
                                  ("E2E", s.slo_e2e_s)) if b is not None]
    return " ".join(f"{n}<={1e3 * b:g}ms" for n, b in bounds) or "no bounds"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1e3 * x:.1f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"
