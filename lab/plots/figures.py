"""The figures: matplotlib's object API (no pyplot, no global backend switch), PNG files.

    timeline_<n>.png        per run: KV usage, running / waiting / swapped requests and scheduled
                            prefill vs decode tokens per step, preemptions marked
    latency_cdf.png         TTFT, TPOT and E2E CDFs, one line per run, SLO bounds dashed
    throughput_goodput.png  output tok/s; request throughput beside goodput, per run
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from lab.plots.data import RunData

PREEMPT_COLOR = "#d62728"
DPI = 120


def timeline(run: RunData, path: Path) -> Path:
    """Three panels over engine steps, preemptions as red ticks on every panel."""
    fig = Figure(figsize=(11, 8), layout="constrained")
    ax_kv, ax_req, ax_tok = fig.subplots(3, 1, sharex=True)
    steps = np.array([s["step"] for s in run.steps])
    # step k is drawn over [k, k+1): every series gets its last value repeated at the end
    col = lambda key: _close(np.array([s.get(key, 0) for s in run.steps]))  # noqa: E731
    edges = _close(steps, steps[-1:] + 1) if len(steps) else steps
    preempted = col("num_preempted")
    usage = 100 * col("kv_cache_usage")
    ax_kv.fill_between(edges, usage, step="post", alpha=0.35)
    ax_kv.plot(edges, usage, drawstyle="steps-post", lw=1)
    ax_kv.set(ylabel="KV cache usage (%)", ylim=(0, 105 if usage.max(initial=0) > 20 else None))
    total = max((s.get("kv_blocks_total") or 0 for s in run.steps), default=0)
    if total:
        ax_kv.secondary_yaxis("right", functions=(lambda u: u * total / 100,
                                                  lambda b: b * 100 / total)).set_ylabel(
            f"blocks used (of {total})")
    for key, name in (("num_running_reqs", "running"), ("num_waiting_reqs", "waiting"),
                      ("num_swapped_reqs", "swapped")):
        ax_req.plot(edges, col(key), drawstyle="steps-post", lw=1.2, label=name)
    ax_req.set(ylabel="requests")
    x, (prefill, decode), width = bin_steps(steps, col("num_prefill_tokens")[:-1],
                                            col("num_decode_tokens")[:-1])
    x, prefill, decode = _close(x, x[-1:] + width), _close(prefill), _close(decode)
    ax_tok.stackplot(x, prefill, decode, labels=["prefill", "decode"], step="post", alpha=0.8)
    per = "per step" if width == 1 else f"per step, mean over {width}-step bins"
    ax_tok.set(ylabel=f"scheduled tokens\n({per})", xlabel="engine step")
    _mark_preemptions([ax_kv, ax_req, ax_tok], steps + 0.5, preempted[:-1])
    for ax in (ax_req, ax_tok):
        ax.legend(loc="upper right", fontsize=8)
    s = run.summary
    fig.suptitle(f"{run.label} — {s.get('num_steps', len(steps))} steps, "
                 f"{s.get('num_preemptions', 0)} preemption(s), peak KV "
                 f"{100 * (s.get('peak_kv_cache_usage') or 0):.3g}%", fontsize=11)
    return _save(fig, path)


def _close(values: np.ndarray, last: np.ndarray | None = None) -> np.ndarray:
    """`values` with one more entry (`last`, default its own last value) for steps-post."""
    if not len(values):
        return values
    return np.append(values, values[-1:] if last is None else last)


def bin_steps(steps: np.ndarray, *series: np.ndarray, max_bins: int = 300):
    """(bin starts, per-bin means of each series, bin width): the identity for short runs."""
    width = max(1, int(np.ceil(len(steps) / max_bins)))
    if width == 1:
        return steps, list(series), 1
    starts = steps[::width]
    means = [np.add.reduceat(v, np.arange(0, len(v), width)) /
             np.diff(np.append(np.arange(0, len(v), width), len(v))) for v in series]
    return starts, means, width


def _mark_preemptions(axes, steps: np.ndarray, preempted: np.ndarray) -> None:
    where = steps[preempted > 0]
    if not len(where):
        return
    for ax in axes:
        ax.vlines(where, 0, 1, transform=ax.get_xaxis_transform(), color=PREEMPT_COLOR,
                  alpha=0.5, lw=1, label=f"preemption ({int(preempted.sum())})")
    axes[0].legend(loc="upper right", fontsize=8)


LATENCIES = (("ttft", "TTFT", "slo_ttft_s"), ("tpot", "TPOT", "slo_tpot_s"),
             ("e2e_latency", "E2E latency", "slo_e2e_s"))


def latency_cdfs(runs: list[RunData], path: Path) -> Path:
    """Empirical CDFs of per-request TTFT, TPOT and E2E, one line per run."""
    fig = Figure(figsize=(14, 4.5), layout="constrained")
    axes = fig.subplots(1, 3)
    for ax, (key, name, slo_key) in zip(axes, LATENCIES):
        for run in runs:
            values = np.sort([r[key] for r in run.requests if r.get(key) is not None])
            if len(values):
                ax.plot(1e3 * values, np.arange(1, len(values) + 1) / len(values),
                        drawstyle="steps-post", label=run.label)
        bounds = {run.summary.get(slo_key) for run in runs} - {None}
        for b in bounds:
            ax.axvline(1e3 * b, color="k", ls="--", lw=1, label=f"SLO {1e3 * b:g} ms")
        ax.set(xlabel=f"{name} (ms)", ylabel="fraction of requests", ylim=(0, 1.02),
               title=f"{name} CDF")
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=8, loc="lower right")
    return _save(fig, path)


def throughput_goodput(runs: list[RunData], path: Path) -> Path:
    """Output tok/s per run; request throughput and goodput side by side per run."""
    fig = Figure(figsize=(12, 1.6 + 0.55 * len(runs)), layout="constrained")
    ax_tok, ax_req = fig.subplots(1, 2, sharey=True)
    y = np.arange(len(runs))[::-1]  # first run on top
    get = lambda key: np.array([r.summary.get(key) or 0.0 for r in runs])  # noqa: E731
    ax_tok.barh(y, get("output_throughput"), color="#4c72b0")
    ax_tok.set(xlabel="output tokens / s", title="output throughput")
    ax_tok.set_yticks(y, [r.label for r in runs], fontsize=8)
    h = 0.38
    ax_req.barh(y + h / 2, get("request_throughput"), h, label="request throughput")
    bars = ax_req.barh(y - h / 2, get("request_goodput"), h, label="goodput (met every SLO)")
    for bar, run in zip(bars, runs):
        att = run.summary.get("slo_attainment")
        if att is not None:
            ax_req.annotate(f" {100 * att:.0f}% met", (bar.get_width(), bar.get_y()
                            + bar.get_height() / 2), va="center", fontsize=8)
    ax_req.set(xlabel="requests / s", title="request throughput vs goodput")
    fig.legend(*ax_req.get_legend_handles_labels(), loc="outside lower right", ncols=2,
               fontsize=8)
    ax_req.margins(x=0.2)
    for ax in (ax_tok, ax_req):
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"goodput: requests meeting {slo_text(runs)}", fontsize=10)
    return _save(fig, path)


def slo_text(runs: list[RunData]) -> str:
    """'TTFT <= 1000 ms, TPOT <= 100 ms' (the SLOs of the runs; 'no SLO bounds' when none)."""
    parts = []
    for _, name, key in LATENCIES:
        bounds = sorted({r.summary.get(key) for r in runs} - {None})
        if bounds:
            parts.append(f"{name.split()[0]} <= " + "/".join(f"{1e3 * b:g}" for b in bounds)
                         + " ms")
    return ", ".join(parts) or "no SLO bounds"


def plot_all(runs: list[RunData], out: Path) -> list[Path]:
    """Every figure for `runs` into `out`; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    files = [timeline(run, out / f"timeline_{i}_{slug(run.label)}.png")
             for i, run in enumerate(runs)]
    files.append(latency_cdfs(runs, out / "latency_cdf.png"))
    files.append(throughput_goodput(runs, out / "throughput_goodput.png"))
    return files


def slug(text: str, max_len: int = 60) -> str:
    return re.sub(r"[^A-Za-z0-9.=_-]+", "_", text).strip("_")[:max_len] or "run"


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI)
    return path
