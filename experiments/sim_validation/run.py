"""How close is the simulator to the real engine on this CPU? Held-out scenarios on two models,
each validated by `python -m lab.sim.validate` (lab/sim/validate.py):

    python experiments/sim_validation/run.py                    # both models, every scenario
    python experiments/sim_validation/run.py --models tiny_llama --scenarios light overloaded
    python experiments/sim_validation/run.py --smoke            # tiny_llama, 2 scenarios, 1 repeat

Per model, one operator profile of this machine (`python -m lab.sim.profile`: a microbenchmark
sweep, no workload of the table fitted), then per scenario --repeats real runs and
--sim-seeds simulated ones (`executor=sim sim/step_time=profiled sim.device=cpu`, variance
sample, the real runs' cache size). Every scenario is held out: the profile never saw a run.

results/table.md and table.csv: per (model, scenario, metric) the real median, the real runs'
spread, the simulated value and the error; results/summary.md the headline per model and
overall. Run directories and the profiles stay under results/runs/ (not committed).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run from a checkout without installing: lab of this repo

from lab.sim.validate import Row, headline, rows_of, validate, write  # noqa: E402

HERE = Path(__file__).resolve().parent
COMMON = ["cpu_threads=1"]
POISSON = ["workload=poisson", "workload.num_prefix_groups=0"]


def uniform(name: str, lo: int, hi: int) -> str:
    return f"workload.{name}={{dist: uniform, min: {lo}, max: {hi}}}"


# per model: scenario -> overrides (rates scaled to the model's capacity on a 2-core CPU:
# tiny_llama ~4000 output tok/s, bench_qwen3_06b ~1 request/s)
SCENARIOS: dict[str, dict[str, list[str]]] = {
    "tiny_llama": {
        "light": [*POISSON, "workload.rate=10", "workload.num_requests=150"],
        "medium": [*POISSON, "workload.rate=40", "workload.num_requests=300"],
        "overloaded": [*POISSON, "workload.rate=400", "workload.num_requests=400"],
        "long_prompts": [*POISSON, "workload.rate=15", "workload.num_requests=150",
                         uniform("prompt_len", 256, 512)],
        "short_prompts_long_outputs": [*POISSON, "workload.rate=20", "workload.num_requests=150",
                                       uniform("prompt_len", 8, 32),
                                       uniform("output_len", 64, 128)],
        "preemption_small_cache": [*POISSON, "workload.rate=40", "workload.num_requests=300",
                                   "num_gpu_blocks=48"],
        "priority_swap": ["workload=synthetic", "workload.arrival=poisson", "workload.rate=40",
                          "workload.num_requests=300", "scheduler=priority", "preemption=swap",
                          "num_gpu_blocks=64"],
        "trace": ["workload=trace"],
    },
    "bench_qwen3_06b": {
        "light": [*POISSON, "workload.rate=0.3", "workload.num_requests=12"],
        "medium": [*POISSON, "workload.rate=0.8", "workload.num_requests=16"],
        "overloaded": [*POISSON, "workload.rate=4", "workload.num_requests=16"],
        "long_prompts": [*POISSON, "workload.rate=0.3", "workload.num_requests=12",
                         uniform("prompt_len", 256, 512)],
        "short_prompts_long_outputs": [*POISSON, "workload.rate=0.5", "workload.num_requests=12",
                                       uniform("prompt_len", 8, 32),
                                       uniform("output_len", 64, 128)],
        "preemption_small_cache": [*POISSON, "workload.rate=1", "workload.num_requests=16",
                                   "num_gpu_blocks=24"],
    },
}


def finished_rows(run_dir: Path, repeats: int, sim_seeds: int) -> list[Row] | None:
    """The rows of a scenario whose runs all finished before (--resume), else None."""
    def summaries(names: list[str]) -> list[dict] | None:
        found = []
        for name in names:
            path = run_dir / name / "summary.json"
            if not path.is_file():
                return None
            found.append(json.loads(path.read_text()))
            if found[-1].get("status") != "finished":
                return None
        return found

    real = summaries([f"real-{i + 1}" for i in range(repeats)])
    sim = summaries([f"sim-{seed}" for seed in range(sim_seeds)])
    if real is None or sim is None:
        return None
    return rows_of(real, sim)


def run_all(models: list[str], scenarios: list[str] | None, out: Path, repeats: int,
            sim_seeds: int, resume: bool = False) -> list[tuple[str, str, list[Row]]]:
    """Every (model, scenario): validated, or (resume) read back from its finished runs; a
    scenario that fails is reported and the others go on."""
    results = []
    profiles = out / "runs" / "profiles"
    for model in models:
        stored = sorted(profiles.glob(f"{model}-*.json")) if resume else []
        profile = stored[-1] if stored else None  # one profile per model, measured once
        for name, overrides in SCENARIOS[model].items():
            if scenarios and name not in scenarios:
                continue
            print(f"== {model} / {name}", flush=True)
            run_dir = out / "runs" / model / name
            rows = finished_rows(run_dir, repeats, sim_seeds) if resume else None
            if rows is None:
                try:
                    rows, profile = validate([f"model={model}", *COMMON, *overrides], run_dir,
                                             repeats, sim_seeds, profile=profile,
                                             cache_dir=profiles)
                except RuntimeError as e:
                    print(f"   FAILED: {e}", flush=True)
                    continue
                write(rows, run_dir, {"overrides": overrides, "profile": profile.name})
            results.append((model, name, rows))
            x, y = headline(rows)
            print(f"   median |error| {x:.1f} % (throughput + p50s), p99 |error| {y:.1f} %",
                  flush=True)
    return results


def write_tables(results: list[tuple[str, str, list[Row]]], out: Path) -> list[str]:
    """table.csv / table.md (every cell) and the summary lines (per model and overall)."""
    with open(out / "table.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "scenario", "metric", "real_median", "real_min", "real_max",
                    "real_spread_pct", "sim", "error_pct", "inside_noise"])
        for model, name, rows in results:
            for r in rows:
                w.writerow([model, name, r.label, r.real_median, min(r.real), max(r.real),
                            r.spread, r.sim_median, r.error, r.inside_noise])
    lines = ["| model | scenario | metric | real | real spread | sim | error | |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for model, name, rows in results:
        for r in rows:
            spread = "-" if r.spread is None else f"{r.spread:.1f} %"
            error = "n/a" if r.error is None else f"{r.error:+.1f} %"
            lines.append(f"| {model} | {name} | {r.label} | {r.real_median:.4g} | {spread} | "
                         f"{r.sim_median:.4g} | {error} | "
                         f"{'inside noise' if r.inside_noise else ''} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    summary = ["| model | scenario | median \\|error\\| (throughput + p50s) | p99 \\|error\\| | "
               "real spread (median over metrics) |", "|---|---|---:|---:|---:|"]
    for model, name, rows in results:
        x, y = headline(rows)
        spread = statistics.median(r.spread for r in rows if r.spread is not None)
        summary.append(f"| {model} | {name} | {x:.1f} % | {y:.1f} % | {spread:.1f} % |")
    for model in dict.fromkeys(m for m, _, _ in results):
        mine = [r for m, _, rows in results if m == model for r in rows]
        x, y = headline(mine)
        summary.append(f"| {model} | all | {x:.1f} % | {y:.1f} % | |")
    x, y = headline([r for _, _, rows in results for r in rows])
    summary += ["", f"median |error| {x:.1f} % (throughput + p50s), p99 |error| {y:.1f} %"]
    (out / "summary.md").write_text("\n".join(summary) + "\n")
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--models", nargs="*", default=list(SCENARIOS), choices=list(SCENARIOS))
    p.add_argument("--scenarios", nargs="*", help="default: every scenario of each model")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sim-seeds", type=int, default=3)
    p.add_argument("--resume", action="store_true",
                   help="keep the scenarios whose runs all finished under --out")
    p.add_argument("--smoke", action="store_true",
                   help="tiny_llama, light and overloaded, 1 real run and 1 seed (minutes)")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as cpu_threads=1: less noise
    if args.smoke:
        args.models, args.scenarios, args.repeats, args.sim_seeds = (
            ["tiny_llama"], ["light", "overloaded"], 1, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    results = run_all(args.models, args.scenarios, args.out, args.repeats, args.sim_seeds,
                      args.resume)
    print("\n".join(write_tables(results, args.out)))


if __name__ == "__main__":
    main()
