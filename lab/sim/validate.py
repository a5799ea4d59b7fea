"""How close is the simulator to this machine? Profile, run real and simulated, compare.

    python -m lab.sim.validate                                   # run.py's default workload
    python -m lab.sim.validate model=bench_qwen3_06b workload=poisson workload.rate=4
    python -m lab.sim.validate --repeats 5 --out outputs/validate/mine scheduler=priority

1. Profile: `python -m lab.sim.profile OVERRIDES` (lab/sim/profile.py), or a stored profile of
   the same engine configuration, machine and commit from this install's cache
   ($LAB_CACHE_DIR or ~/.cache/lab, sim_profiles/); --profile PATH gives one, --reprofile
   measures anew.
2. Real: `python run.py OVERRIDES` --repeats times (3), each warmed up before its clock starts.
3. Simulated: `python run.py OVERRIDES executor=sim sim/step_time=profiled sim.device=cpu` with
   the same cache size as the real runs had; with --variance sample (the default) once per
   seed (--sim-seeds, 3) and the median taken.
4. A table: metric, real (median of the repeats), the real runs' own spread ((max - min) /
   median), sim, error % (sim vs the real median), and "inside noise" where the simulated
   value lies within the real runs' range. Then one last line:

       median |error| X % (throughput + p50s), p99 |error| Y %

   X over output tok/s and the TTFT, TPOT and E2E p50s; Y the median over the three p99s.
   Preemptions are compared as counts (not in X or Y).

Every run directory, the profile, table.md, table.csv and validation.json stay under --out.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from lab.core.step import StepShape

#: (label, summary.json field, kind): kind "p50" counts in X, "p99" in Y, "count" in neither
METRICS = (("output tok/s", "output_throughput", "p50"), ("TTFT p50", "ttft_p50", "p50"),
           ("TPOT p50", "tpot_p50", "p50"), ("E2E p50", "e2e_p50", "p50"),
           ("TTFT p99", "ttft_p99", "p99"), ("TPOT p99", "tpot_p99", "p99"),
           ("E2E p99", "e2e_p99", "p99"), ("preemptions", "num_preemptions", "count"))
SIM = ["executor=sim", "sim/step_time=profiled", "sim.device=cpu"]
LOGGERS = ["logger=[jsonl]"]  # every run writes its steps; the profile is measured with the same


@dataclass
class Row:
    """One metric: the real runs' values, the simulated runs' values."""

    label: str
    field: str
    kind: str
    real: list[float]
    sim: list[float]

    @property
    def real_median(self) -> float:
        return statistics.median(self.real)

    @property
    def sim_median(self) -> float:
        return statistics.median(self.sim)

    @property
    def spread(self) -> float | None:
        """(max - min) / median of the real runs, in %."""
        m = self.real_median
        return 100 * (max(self.real) - min(self.real)) / m if m else None

    @property
    def error(self) -> float | None:
        """(sim - real) / real in %; None for a count whose real median is 0."""
        m = self.real_median
        if not m:
            return 0.0 if self.sim_median == 0 else None
        return 100 * (self.sim_median - m) / m

    @property
    def inside_noise(self) -> bool:
        return min(self.real) <= self.sim_median <= max(self.real)


def profile_path(overrides: list[str], cache_dir: Path) -> tuple[Path, dict[str, Any]]:
    """Where this machine's profile of this configuration at this commit is stored."""
    from lab.config.compose import compose_with_choices
    from lab.platform import source_commit
    from lab.sim.profile import fingerprint, machine

    cfg, choices = compose_with_choices(overrides)
    m = machine()
    key = {"config": fingerprint(cfg), "cpu": m["cpu"], "cpus": m["cpus"], "torch": m["torch"],
           "gpu": m["gpu"], "commit": source_commit()}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    return cache_dir / f"{choices.get('model', 'model')}-{digest[:16]}.json", key


def mismatches(profile: dict[str, Any], overrides: list[str]) -> list[str]:
    """How a profile's engine configuration differs from the one these overrides compose."""
    from lab.config.compose import compose_config
    from lab.sim.profile import fingerprint

    mine, theirs = fingerprint(compose_config(overrides)), profile.get("config", {})
    return [f"{key}: the profile was measured with {theirs.get(key)!r}, the runs use "
            f"{mine[key]!r}" for key in mine if theirs.get(key) != mine[key]]


def run_py(overrides: list[str], run_dir: Path) -> dict[str, Any]:
    """`python run.py OVERRIDES` into run_dir (jsonl logger only); its summary.json."""
    cmd = [sys.executable, "-m", "lab.run", *overrides, f"hydra.run.dir={run_dir}"]
    print("  $ python run.py", " ".join(cmd[3:]), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    summary = run_dir / "summary.json"
    if proc.returncode != 0 or not summary.is_file():
        raise RuntimeError(f"run.py {' '.join(overrides)} failed ({proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    return json.loads(summary.read_text())


def ensure_profile(overrides: list[str], given: Path | None, reprofile: bool,
                   cache_dir: Path) -> Path:
    """The profile to simulate with: given, stored, or measured now (then stored)."""
    if given is not None:
        for line in mismatches(json.loads(given.read_text()), overrides):
            print(f"profile: warning: {line}", flush=True)
        return given
    path, _ = profile_path(overrides, cache_dir)
    if path.is_file() and not reprofile:
        print(f"profile: reusing {path}", flush=True)
        return path
    print(f"profile: measuring -> {path}", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "lab.sim.profile", *overrides, "-o",
                           str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"python -m lab.sim.profile failed:\n{proc.stderr[-3000:]}")
    print("  " + "\n  ".join(proc.stdout.strip().splitlines()[-4:]), flush=True)
    return path


def validate(overrides: list[str], out: Path, repeats: int = 3, sim_seeds: int = 3,
             variance: str = "sample", profile: Path | None = None, reprofile: bool = False,
             cache_dir: Path | None = None) -> tuple[list[Row], Path]:
    """Real and simulated runs of `run.py OVERRIDES`; the rows of the table and the profile."""
    if cache_dir is None:
        from lab.kernels.cpu_ext import lab_cache_dir

        cache_dir = lab_cache_dir() / "sim_profiles"
    out.mkdir(parents=True, exist_ok=True)
    overrides = [*overrides, *LOGGERS]
    path = ensure_profile(overrides, profile, reprofile, cache_dir)
    if path.resolve() != (out / "profile.json").resolve():
        shutil.copyfile(path, out / "profile.json")  # the run's record keeps what it used
    real = [run_py(overrides, out / f"real-{i + 1}") for i in range(repeats)]
    blocks = {s["num_kv_blocks"] for s in real}
    if len(blocks) != 1:
        raise RuntimeError(f"the real runs planned different caches ({sorted(blocks)} blocks)")
    same_cache = [f"num_gpu_blocks={blocks.pop() + 1}"]  # + the null block
    seeds = range(sim_seeds if variance == "sample" else 1)
    sim = [run_py([*overrides, *SIM, *same_cache, f"sim.step_time.path={path}",
                   f"sim.step_time.variance={variance}", f"sim.step_time.seed={seed}"],
                  out / f"sim-{seed}") for seed in seeds]
    return rows_of(real, sim), path


def rows_of(real: list[dict[str, Any]], sim: list[dict[str, Any]]) -> list[Row]:
    """The table's rows from the real and the simulated runs' summary.json records."""
    return [Row(label, field, kind, [float(s.get(field) or 0) for s in real],
                [float(s.get(field) or 0) for s in sim]) for label, field, kind in METRICS]


def step_shape(record: dict[str, Any], previous: dict[str, Any] | None = None) -> StepShape:
    """The StepShape of a steps.jsonl record (after the `previous` one)."""
    return StepShape(
        record["num_scheduled_tokens"], record["num_prefill_reqs"], record["num_decode_reqs"],
        record["prefill_attention_pairs"], record["decode_context_tokens"],
        record.get("swap_in_blocks", 0), record.get("swap_out_blocks", 0),
        tuple(tuple(c) for c in record.get("prefill_chunks", ())),
        record.get("max_query_len", 0), record.get("max_context_len", 0),
        record.get("num_sampled_reqs", 0), record.get("num_new_reqs", 0),
        record.get("num_finished", 0), not busy_before(previous),
        record.get("num_draft_tokens", 0))


def busy_before(previous: dict[str, Any] | None) -> bool:
    """Whether the engine had requests after the previous step (so looped on, not waited)."""
    return previous is not None and (previous["num_running_reqs"] + previous["num_waiting_reqs"]
                                     + previous.get("num_swapped_reqs", 0)) > 0


def step_seconds(record: dict[str, Any], previous: dict[str, Any] | None = None) -> float:
    """What the simulator's clock must advance by for a real step: the time since the previous
    step ended when the engine was busy in between (the whole loop: schedule, execute, update,
    outputs, loggers, the replay), else (after an idle wait, or the first step) the step's own
    schedule + execute + update time."""
    if busy_before(previous):
        return record["time"] - previous["time"]
    return record["schedule_time"] + record["execute_time"] + record.get("update_time", 0.0)


def step_errors(run_dir: Path, profile: Path) -> dict[str, tuple[int, float, float]]:
    """Per kind of step (decode, prefill, mixed) of a real run: (steps, measured seconds,
    the profile's median prediction for the same shapes): where a simulation's error comes
    from."""
    from lab.sim.step_time.profiled import ProfiledStepTime

    ops = ProfiledStepTime(str(profile), variance="median").operators
    lines = (run_dir / "steps.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    out: dict[str, list[float]] = {}
    for previous, record in zip([None, *records[:-1]], records):
        shape = step_shape(record, previous)
        kind = ("decode" if not shape.num_prefill_reqs else
                "prefill" if not shape.num_decode_reqs else "mixed")
        n, measured, predicted = out.setdefault(kind, [0, 0.0, 0.0])
        out[kind] = [n + 1, measured + step_seconds(record, previous),
                     predicted + ops.predict(shape)]
    return {k: (int(v[0]), v[1], v[2]) for k, v in out.items()}


def step_lines(errors: dict[str, tuple[int, float, float]]) -> list[str]:
    return [f"{kind:8} steps {n:5}  measured {1e3 * m:9.1f} ms  predicted {1e3 * p:9.1f} ms  "
            f"({100 * (p - m) / m:+.1f} %)" for kind, (n, m, p) in errors.items() if m]


def headline(rows: list[Row]) -> tuple[float, float]:
    """(median |error| over throughput and the p50s, median |error| over the p99s), in %."""
    def med(kind: str) -> float:
        return statistics.median(abs(r.error) for r in rows if r.kind == kind
                                 and r.error is not None)
    return med("p50"), med("p99")


def _fmt(value: float, field: str) -> str:
    if field == "num_preemptions":
        return f"{value:.0f}"
    if field == "output_throughput":
        return f"{value:.1f}"
    return f"{1e3 * value:.1f} ms"


def table(rows: list[Row]) -> list[str]:
    """The table as markdown lines, then the headline line."""
    lines = ["| metric | real (median) | real spread | sim | error | |",
             "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        spread = "-" if r.spread is None else f"{r.spread:.1f} %"
        error = "n/a" if r.error is None else f"{r.error:+.1f} %"
        note = "inside noise" if r.inside_noise else ""
        lines.append(f"| {r.label} | {_fmt(r.real_median, r.field)} | {spread} | "
                     f"{_fmt(r.sim_median, r.field)} | {error} | {note} |")
    x, y = headline(rows)
    return [*lines, "", f"median |error| {x:.1f} % (throughput + p50s), p99 |error| {y:.1f} %"]


def write(rows: list[Row], out: Path, meta: dict[str, Any]) -> None:
    lines = table(rows)
    (out / "table.md").write_text("\n".join(lines) + "\n")
    with open(out / "table.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["metric", "real_median", "real_min", "real_max", "real_spread_pct", "sim",
                    "error_pct", "inside_noise"])
        for r in rows:
            w.writerow([r.label, r.real_median, min(r.real), max(r.real), r.spread,
                        r.sim_median, r.error, r.inside_noise])
    x, y = headline(rows)
    (out / "validation.json").write_text(json.dumps(
        {**meta, "median_abs_error_pct": x, "p99_abs_error_pct": y,
         "rows": [vars(r) | {"error_pct": r.error, "spread_pct": r.spread} for r in rows]},
        indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m lab.sim.validate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", help="run.py overrides: model, workload, policies")
    p.add_argument("--repeats", type=int, default=3, help="real runs (>= 3 for a spread)")
    p.add_argument("--sim-seeds", type=int, default=3, help="simulated runs (variance sample)")
    p.add_argument("--variance", choices=("sample", "median"), default="sample")
    p.add_argument("--profile", type=Path, help="a profile to use instead of the stored one")
    p.add_argument("--reprofile", action="store_true", help="measure the profile anew")
    p.add_argument("--out", type=Path, help="default outputs/validate/DATE_TIME")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.sim_seeds < 1:
        p.error("--repeats and --sim-seeds must be >= 1")
    out = args.out or Path("outputs/validate") / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    rows, path = validate(args.overrides, out, args.repeats, args.sim_seeds, args.variance,
                          args.profile, args.reprofile)
    write(rows, out, {"overrides": args.overrides, "repeats": args.repeats,
                      "sim_seeds": args.sim_seeds, "variance": args.variance,
                      "profile": str(path)})
    print("\n".join(table(rows)))
    print("\nreal run 1, its steps against the profile's medians:")
    print("\n".join(step_lines(step_errors(out / "real-1", path))))


if __name__ == "__main__":
    main()
