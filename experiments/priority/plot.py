"""Plot a priority sweep: TTFT of the high-priority class and per client, per queue policy.

    python experiments/priority/plot.py experiments/priority/runs/<stamp> --out experiments/priority/results/

Reads every job directory of the sweep (config.yaml, requests.jsonl, summary.json) and writes
ttft_high_priority.png, ttft_per_client.png and summary.md into --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib
import numpy as np
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

POLICIES = ["fcfs", "priority", "sjf", "fair"]  # plot order; others follow by name


def load(sweep: Path) -> list[dict]:
    """One record per job: policy, rate, its finished requests and its summary."""
    jobs = []
    for cfg_path in sorted(sweep.glob("*/config.yaml")):
        job = cfg_path.parent
        cfg = yaml.safe_load(cfg_path.read_text())
        target = cfg["scheduler"]["_target_"].rsplit(".", 1)[-1]  # e.g. FCFSQueue
        with open(job / "requests.jsonl") as f:
            requests = [json.loads(line) for line in f if line.strip()]
        jobs.append({
            "policy": target.removesuffix("Queue").lower(),
            "rate": float(cfg["workload"]["rate"]),
            "requests": requests,
            "summary": json.loads((job / "summary.json").read_text()),
        })
    order = {p: i for i, p in enumerate(POLICIES)}
    return sorted(jobs, key=lambda j: (order.get(j["policy"], len(order)), j["policy"], j["rate"]))


def ttft(requests: list[dict], **match: object) -> np.ndarray:
    """TTFTs (seconds) of the requests whose fields equal `match`."""
    return np.array([r["ttft"] for r in requests if r["ttft"] is not None
                     and all(r[k] == v for k, v in match.items())])


def pct(values: np.ndarray, p: float) -> float:
    return float(np.percentile(values, p)) if len(values) else float("nan")


def plot_high_priority(jobs: list[dict], out: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, p in zip(axes, (50, 99)):
        for policy in dict.fromkeys(j["policy"] for j in jobs):
            mine = [j for j in jobs if j["policy"] == policy]
            ax.plot([j["rate"] for j in mine],
                    [pct(ttft(j["requests"], priority=0), p) * 1e3 for j in mine],
                    marker="o", label=policy)
        ax.set(title=f"priority-0 TTFT p{p}", xlabel="request rate (req/s)", yscale="log")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("TTFT (ms, log scale)")
    axes[0].legend(title="scheduler")
    fig.tight_layout()
    fig.savefig(out / "ttft_high_priority.png", dpi=120)
    plt.close(fig)


def plot_per_client(jobs: list[dict], out: Path) -> None:
    rate = max(j["rate"] for j in jobs)
    top = [j for j in jobs if j["rate"] == rate]
    clients = sorted({r["client_id"] for j in top for r in j["requests"]}, key=str)
    width = 0.8 / len(clients)
    fig, ax = plt.subplots(figsize=(9, 4))
    x = np.arange(len(top))
    for i, client in enumerate(clients):
        ax.bar(x + (i - (len(clients) - 1) / 2) * width,
               [pct(ttft(j["requests"], client_id=client), 99) * 1e3 for j in top],
               width, label=str(client))
    ax.set_xticks(x, [j["policy"] for j in top])
    ax.set(title=f"TTFT p99 per client at {rate:g} req/s", ylabel="TTFT p99 (ms)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(title="client", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(out / "ttft_per_client.png", dpi=120)
    plt.close(fig)


def write_table(jobs: list[dict], out: Path) -> None:
    lines = ["| policy | rate (req/s) | prio-0 TTFT p50 (ms) | prio-0 TTFT p99 (ms) "
             "| TTFT p99 all (ms) | output tok/s | preemptions |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for j in jobs:
        high, s = ttft(j["requests"], priority=0), j["summary"]
        lines.append(
            f"| {j['policy']} | {j['rate']:g} | {pct(high, 50) * 1e3:.0f} "
            f"| {pct(high, 99) * 1e3:.0f} | {pct(ttft(j['requests']), 99) * 1e3:.0f} "
            f"| {s['output_throughput']:.0f} | {s['num_preemptions']} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweep", type=Path, help="a sweep directory (hydra.sweep.dir)")
    ap.add_argument("--out", type=Path, default=Path("experiments/priority/results"))
    args = ap.parse_args()
    jobs = load(args.sweep)
    if not jobs:
        raise SystemExit(f"no job directories with config.yaml under {args.sweep}")
    args.out.mkdir(parents=True, exist_ok=True)
    plot_high_priority(jobs, args.out)
    plot_per_client(jobs, args.out)
    write_table(jobs, args.out)
    print(f"{len(jobs)} jobs -> {args.out}")


if __name__ == "__main__":
    main()
