"""Scheduling policies at scale, simulated: a Llama-3-8B-shaped model on a simulated H100
(sim/step_time=roofline), 10k requests per point at rising Poisson rates, scheduler
fcfs / priority / sjf / fair x preemption recompute / swap. One command:

    python experiments/sim_scale/run.py                   # full (an hour or so of CPU)
    python experiments/sim_scale/run.py --smoke           # a minute: 200 requests, 2 rates

Writes results/summary.csv (one row per point: output tok/s, TTFT and TPOT p50/p99,
preemptions), results/table.md and results/plots/{throughput,ttft_p99,tpot_p99}.png. Every number
is simulated (virtual time), deterministic for a seed, and only as good as the roofline model.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root: run as a script from anywhere

from lab.config.compose import compose_config  # noqa: E402
from lab.engine.llm_engine import LLMEngine  # noqa: E402
from lab.engine.replay import replay  # noqa: E402
from lab.sim.configs import write_configs  # noqa: E402
from lab.workloads.synthetic import SyntheticWorkload  # noqa: E402

SCHEDULERS = ("fcfs", "priority", "sjf", "fair")
PREEMPTIONS = ("recompute", "swap")
RATES = (16, 32, 48, 64)  # requests/s: from light load to past the roofline capacity
FIELDS = ("output_throughput", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "e2e_p99",
          "num_preemptions", "swap_out_blocks", "num_steps", "wall_time", "num_kv_blocks")


def workload(n: int, rate: float, seed: int) -> SyntheticWorkload:
    """Prompts ~512 tokens (lognormal, up to 2048), outputs 16-512: at high load up to 1024
    running requests (max_num_seqs) want more KV than the H100 holds (~460k tokens), so it
    preempts; 3 priority classes and 4 clients
    for the priority and fair policies. (Half the lengths of a chat trace, so that 10k requests
    x 32 points simulate in about half an hour on two cores.)"""
    return SyntheticWorkload(
        num_requests=n, prompt_len={"dist": "lognormal", "min": 32, "max": 2048, "mean": 512,
                                    "std": 256},
        output_len={"dist": "uniform", "min": 16, "max": 512}, arrival="poisson", rate=rate,
        num_priorities=3, num_clients=4, seed=seed)


def run_point(model_dir: Path, scheduler: str, preemption: str, rate: float, n: int,
              device: str, seed: int) -> dict:
    cfg = compose_config([
        "executor=sim", "sim/step_time=roofline", f"sim.device={device}", "model=hf",
        f"model.path={model_dir}", f"scheduler={scheduler}", f"preemption={preemption}",
        "max_num_seqs=1024", "max_num_batched_tokens=8192", "logger=[]", f"seed={seed}"])
    engine = LLMEngine(cfg)
    reqs = workload(n, rate, seed).requests(engine.model_info.vocab_size, engine.eos_token_id)
    summary = replay(engine, reqs).to_dict()
    return {"scheduler": scheduler, "preemption": preemption, "rate": rate,
            **{k: summary[k] for k in FIELDS}}


def _run_and_print(point: tuple) -> dict:
    r = run_point(*point)
    print(f"{r['scheduler']:8s} {r['preemption']:9s} {r['rate']:5g} req/s: "
          f"{r['output_throughput']:.0f} tok/s, TTFT p99 {r['ttft_p99']:.3f} s, "
          f"TPOT p99 {r['tpot_p99']:.4f} s, {r['num_preemptions']} preemptions", flush=True)
    return r


def write_table(rows: list[dict], out: Path, header: str) -> None:
    with open(out / "summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    cols = ["scheduler", "preemption", "rate", *FIELDS[:6], "num_preemptions"]
    lines = [header, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r[c]) for c in cols) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def plot(rows: list[dict], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (out / "plots").mkdir(exist_ok=True)
    for metric, label, name in [("output_throughput", "output tok/s", "throughput"),
                                ("ttft_p99", "TTFT p99 (s)", "ttft_p99"),
                                ("tpot_p99", "TPOT p99 (s)", "tpot_p99")]:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for s in SCHEDULERS:
            for p, style in zip(PREEMPTIONS, ("-", "--")):
                pts = [(r["rate"], r[metric]) for r in rows
                       if r["scheduler"] == s and r["preemption"] == p and r[metric] is not None]
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", label=f"{s} / {p}")
        ax.set_xlabel("request rate (req/s, Poisson)")
        ax.set_ylabel(label)
        if metric != "output_throughput":
            ax.set_yscale("log")
        ax.set_title(f"{title}: {label}", fontsize=9)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(out / "plots" / f"{name}.png", dpi=120)
        plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--requests", type=int, default=10000)
    p.add_argument("--rates", type=float, nargs="*", default=list(RATES))
    p.add_argument("--schedulers", nargs="*", default=list(SCHEDULERS))
    p.add_argument("--preemptions", nargs="*", default=list(PREEMPTIONS))
    p.add_argument("--device", default="h100")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="200 requests, rates 10 and 40")
    p.add_argument("--jobs", type=int, default=1, help="points simulated in parallel processes")
    args = p.parse_args()
    if args.smoke:
        args.requests, args.rates = 200, [10.0, 40.0]
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = write_configs(args.out / "configs", ["llama3_8b"])["llama3_8b"]
    points = [(model_dir, s, pre, rate, args.requests, args.device, args.seed)
              for s in args.schedulers for pre in args.preemptions for rate in args.rates]
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(_run_and_print, points))
    print(f"{len(rows)} points, {args.requests} requests each: "
          f"{time.perf_counter() - start:.0f} s wall with {args.jobs} process(es)", flush=True)
    title = (f"SIMULATED Llama-3-8B on {args.device.upper()} (roofline), "
             f"{args.requests} requests per point")
    write_table(rows, args.out, f"# {title}")
    plot(rows, args.out, title)


if __name__ == "__main__":
    main()
