"""Plot a preemption sweep: throughput, TTFT, TPOT and preemptions per strategy vs KV cache size.

    python experiments/preemption/plot.py experiments/preemption/runs/<stamp> --out experiments/preemption/results/

Reads every job directory of the sweep (config.yaml, summary.json) and writes
throughput_latency.png, preemptions.png and summary.md into --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib
import matplotlib.ticker
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STRATEGIES = ["recompute", "swap", "reserve"]  # plot order; others follow by name


def color(strategy: str) -> str:
    """One colour per strategy in every panel."""
    return f"C{STRATEGIES.index(strategy) if strategy in STRATEGIES else len(STRATEGIES)}"


def load(sweep: Path) -> list[dict]:
    """One record per job: strategy, cache size in blocks, and the run's summary."""
    jobs = []
    for cfg_path in sorted(sweep.glob("*/config.yaml")):
        cfg = yaml.safe_load(cfg_path.read_text())
        summary_path = cfg_path.parent / "summary.json"
        if not summary_path.exists():
            continue  # a job that did not finish
        target = cfg["preemption"]["_target_"].rsplit(".", 1)[-1]  # e.g. SwapPreemption
        jobs.append({
            "strategy": target.removesuffix("Preemption").lower(),
            "blocks": int(cfg["num_gpu_blocks"]),
            "summary": json.loads(summary_path.read_text()),
        })
    order = {s: i for i, s in enumerate(STRATEGIES)}
    return sorted(jobs, key=lambda j: (order.get(j["strategy"], len(order)), j["strategy"],
                                       j["blocks"]))


def _series(jobs: list[dict], key, scale: float = 1.0):
    """{strategy: (cache sizes, values)} for one summary field (or a function of the summary)."""
    out = {}
    for strategy in dict.fromkeys(j["strategy"] for j in jobs):
        mine = [j for j in jobs if j["strategy"] == strategy]
        values = [key(j["summary"]) if callable(key) else j["summary"][key] for j in mine]
        out[strategy] = ([j["blocks"] for j in mine],
                         [float("nan") if v is None else v * scale for v in values])
    return out


def _cache_axis(ax, jobs: list[dict]) -> None:
    """Log-scaled x axis labelled with the swept cache sizes only."""
    sizes = sorted({j["blocks"] for j in jobs})
    ax.set(xlabel="KV cache (blocks of 16 tokens)", xscale="log")
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.grid(True, which="both", alpha=0.3)


def plot_throughput_latency(jobs: list[dict], out: Path) -> None:
    panels = [("output_throughput", 1.0, "output tok/s", "linear"),
              ("ttft_p50", 1e3, "TTFT p50 (ms)", "log"), ("ttft_p99", 1e3, "TTFT p99 (ms)", "log"),
              ("tpot_p50", 1e3, "TPOT p50 (ms)", "linear"),
              ("tpot_p99", 1e3, "TPOT p99 (ms)", "linear"),
              ("e2e_p99", 1e3, "E2E p99 (ms)", "log")]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, (key, scale, label, yscale) in zip(axes.flat, panels):
        for strategy, (x, y) in _series(jobs, key, scale).items():
            ax.plot(x, y, marker="o", label=strategy, color=color(strategy))
        ax.set(title=label, yscale=yscale)
        _cache_axis(ax, jobs)
    axes.flat[0].legend(title="preemption")
    fig.tight_layout()
    fig.savefig(out / "throughput_latency.png", dpi=120)
    plt.close(fig)


def plot_preemptions(jobs: list[dict], out: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for strategy, (x, y) in _series(jobs, "num_preemptions").items():
        axes[0].plot(x, y, marker="o", label=strategy, color=color(strategy))
    for strategy, (x, y) in _series(jobs, lambda s: s["swap_out_bytes"] / 2**20).items():
        if any(v > 0 for v in y):
            axes[1].plot(x, y, marker="o", label=f"{strategy}: swapped out", color=color(strategy))
    for strategy, (x, y) in _series(jobs, "num_swap_fallbacks").items():
        if any(v > 0 for v in y):
            axes[0].plot(x, y, marker="x", linestyle="--", label=f"{strategy}: fell back",
                         color=color(strategy))
    axes[0].set(title="preemptions per run", ylabel="count")
    axes[1].set(title="KV bytes swapped out per run", ylabel="MiB")
    for ax in axes:
        _cache_axis(ax, jobs)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "preemptions.png", dpi=120)
    plt.close(fig)


def write_table(jobs: list[dict], out: Path) -> None:
    lines = ["| preemption | blocks | output tok/s | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) "
             "| preemptions | swapped out (blocks) | swap fallbacks | peak KV use |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for j in jobs:
        s = j["summary"]
        lines.append(
            f"| {j['strategy']} | {j['blocks']} | {s['output_throughput']:.0f} "
            f"| {_ms(s['ttft_p50'])} / {_ms(s['ttft_p99'])} "
            f"| {_ms(s['tpot_p50'], 1)} / {_ms(s['tpot_p99'], 1)} | {s['num_preemptions']} "
            f"| {s['swap_out_blocks']} | {s['num_swap_fallbacks']} "
            f"| {s['peak_kv_cache_usage']:.0%} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def _ms(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value * 1e3:.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweep", type=Path, help="a sweep directory (hydra.sweep.dir)")
    ap.add_argument("--out", type=Path, default=Path("experiments/preemption/results"))
    args = ap.parse_args()
    jobs = load(args.sweep)
    if not jobs:
        raise SystemExit(f"no finished job directories under {args.sweep}")
    args.out.mkdir(parents=True, exist_ok=True)
    plot_throughput_latency(jobs, args.out)
    plot_preemptions(jobs, args.out)
    write_table(jobs, args.out)
    print(f"{len(jobs)} jobs -> {args.out}")


if __name__ == "__main__":
    main()
