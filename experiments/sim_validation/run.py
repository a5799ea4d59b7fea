"""How close is the simulator to the real engine on this CPU? One command:

    python experiments/sim_validation/run.py              # full: tiny_llama + bench_qwen3_06b
    python experiments/sim_validation/run.py --smoke      # minutes: tiny_llama, tiny sizes

1. Profile: per model, a few real runs (executor=uniproc, attention=torch, device=cpu) of
   different shapes (decode-heavy, prefill-heavy, mixed Poisson), then
   `python -m lab.sim.profile` fits sim/step_time=profiled to their steps.
2. Held out: workloads the profile never saw (other rates, lengths, prefix sharing, policies,
   cache sizes), each run for real and simulated (executor=sim sim/step_time=profiled
   sim.device=cpu, the same num_gpu_blocks).
3. Table: output tok/s, TTFT p50/p99, TPOT p50/p99, real vs sim and the error in %
   (results/table.md, results/table.csv).

Timings on a shared machine are noisy: run the full version on a quiet one. Every run directory
(steps.jsonl, requests.jsonl, summary.json, config.yaml) stays under results/runs/.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
METRICS = ("output_throughput", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99")
REAL = ["executor=uniproc", "attention=torch", "device=cpu"]

# (name, overrides): shapes the fit needs — long decodes, long prefills, a mix under load
PROFILE = [
    ("decode_heavy", ["workload.prompt_len={dist: uniform, min: 8, max: 32}",
                      "workload.output_len={dist: uniform, min: 48, max: 96}",
                      "workload.num_prefix_groups=0"]),
    ("prefill_heavy", ["workload.prompt_len={dist: uniform, min: 128, max: 400}",
                       "workload.output_len={dist: uniform, min: 2, max: 8}",
                       "workload.num_prefix_groups=0", "max_num_batched_tokens=512"]),
    # many short prompts admitted together: separates the per-request cost of a prefill chunk
    # from its per-token cost (long prefills alone leave the two collinear)
    ("short_prefills", ["workload.prompt_len={dist: uniform, min: 8, max: 48}",
                        "workload.output_len={dist: uniform, min: 4, max: 16}",
                        "workload.num_prefix_groups=0"]),
    ("mixed_poisson", ["workload.arrival=poisson", "workload.rate=12",
                       "workload.prompt_len={dist: uniform, min: 16, max: 200}",
                       "workload.output_len={dist: uniform, min: 8, max: 64}",
                       "workload.num_prefix_groups=0"]),
]
# (name, overrides): held-out scenarios, each run real and simulated with the same cache
HELD_OUT = [
    ("poisson_r4", ["workload=poisson", "workload.rate=4"]),
    ("poisson_r16_long", ["workload=poisson", "workload.rate=16",
                          "workload.prompt_len={dist: uniform, min: 64, max: 256}"]),
    ("shared_prefix", ["workload=shared_prefix"]),
    ("priority_swap_small_cache", ["scheduler=priority", "preemption=swap",
                                   "num_gpu_blocks=48"]),
    ("sjf_bursty", ["scheduler=sjf", "workload=poisson", "workload.arrival=gamma",
                    "workload.rate=10", "workload.burstiness=0.3"]),
    ("fair_recompute_tight", ["scheduler=fair", "workload.num_clients=3", "num_gpu_blocks=40",
                              "max_num_batched_tokens=256"]),
]
# per model: requests per run (real runs ~10-40 s each on a quiet 2-core CPU) and a cache size
MODELS = {"tiny_llama": {"requests": 64, "blocks": 256},
          "bench_qwen3_06b": {"requests": 16, "blocks": 256}}
SMOKE = {"tiny_llama": {"requests": 8, "blocks": 64}}


def run(run_dir: Path, overrides: list[str], reuse: bool = False) -> dict:
    """`python run.py` into run_dir; its summary.json (`reuse`: an existing finished run's)."""
    summary = run_dir / "summary.json"
    if reuse and summary.is_file() and json.loads(summary.read_text()).get("status") == "finished":
        print(f"  (reusing {run_dir})", flush=True)
        return json.loads(summary.read_text())
    cmd = [sys.executable, "run.py", *overrides, "logger=[jsonl]", f"hydra.run.dir={run_dir}"]
    print("  $", " ".join(cmd[1:]), flush=True)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"run failed ({run_dir}):\n{proc.stderr[-3000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def has_override(overrides: list[str], key: str) -> bool:
    return any(o.startswith(f"{key}=") for o in overrides)


def profile_model(model: str, size: dict, out: Path, reuse: bool = False) -> Path:
    """Real profiling runs of `model`, then the fitted profile's path."""
    dirs = []
    for name, overrides in PROFILE:
        run_dir = out / "runs" / model / f"profile_{name}"
        run(run_dir, [f"model={model}", *REAL, *overrides,
                      f"workload.num_requests={size['requests']}",
                      f"num_gpu_blocks={size['blocks']}"], reuse)
        dirs.append(run_dir)
    path = out / f"profile_{model}.json"
    # the profile records its runs' directories: relative to the repository, as committed
    runs = [os.path.relpath(d, REPO) for d in dirs]
    subprocess.run([sys.executable, "-m", "lab.sim.profile", *runs, "-o", str(path)],
                   cwd=REPO, check=True)
    return path


def held_out(model: str, size: dict, profile: Path, out: Path, reuse: bool = False) -> list[dict]:
    """Each held-out scenario real and simulated: one row per (scenario, metric)."""
    rows = []
    for name, overrides in HELD_OUT:
        common = [f"model={model}", *overrides, f"workload.num_requests={size['requests']}"]
        if not has_override(overrides, "num_gpu_blocks"):
            common.append(f"num_gpu_blocks={size['blocks']}")
        real = run(out / "runs" / model / f"real_{name}", [*common, *REAL], reuse)
        sim = run(out / "runs" / model / f"sim_{name}",
                  [*common, "executor=sim", "sim/step_time=profiled",
                   f"sim.step_time.path={profile}", "sim.device=cpu"])
        for metric in METRICS:
            r, s = real.get(metric), sim.get(metric)
            err = 100.0 * (s - r) / r if r and s is not None else None
            rows.append({"model": model, "scenario": name, "metric": metric,
                         "real": r, "sim": s, "error_pct": err})
    return rows


def write_table(rows: list[dict], out: Path) -> None:
    with open(out / "table.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = ["| model | scenario | metric | real | sim | error % |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['scenario']} | {r['metric']} | {_fmt(r['real'])} | "
                     f"{_fmt(r['sim'])} | {_fmt(r['error_pct'], '.1f')} |")
    errs = [abs(r["error_pct"]) for r in rows if r["error_pct"] is not None]
    if errs:
        lines.append(f"\nmean |error| {sum(errs) / len(errs):.1f}% over {len(errs)} cells")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _fmt(v, spec: str = ".4g") -> str:
    return "-" if v is None else format(v, spec)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--smoke", action="store_true", help="tiny_llama, 8 requests, 2 scenarios")
    p.add_argument("--models", nargs="*", help="default: tiny_llama bench_qwen3_06b")
    p.add_argument("--reuse-real", action="store_true",
                   help="keep finished real runs (profiling and held-out) in --out; refit the "
                        "profiles and rerun only the simulations")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as the other CPU studies: less noise
    sizes = SMOKE if args.smoke else MODELS
    if args.smoke:
        del HELD_OUT[2:]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for model in args.models or list(sizes):
        size = sizes.get(model, MODELS.get(model, {"requests": 16, "blocks": 256}))
        print(f"== {model}: profiling", flush=True)
        profile = profile_model(model, size, args.out, args.reuse_real)
        print(f"== {model}: held-out workloads, real and simulated", flush=True)
        rows += held_out(model, size, profile, args.out, args.reuse_real)
    write_table(rows, args.out)


if __name__ == "__main__":
    main()
