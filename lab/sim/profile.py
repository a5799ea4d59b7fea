"""Fit a `sim/step_time=profiled` model to the steps of real runs.

    python run.py model=tiny_llama ...                   # a few runs of different shapes
    python -m lab.sim.profile outputs/DAY/RUN1 outputs/DAY/RUN2 -o profile.json
    python run.py executor=sim sim/step_time=profiled sim.step_time.path=profile.json sim.device=cpu

Each run directory's steps.jsonl gives one row per step: the step's shape (StepShape fields) and
its measured time (`step_seconds`: the time since the previous step while the engine was busy,
else schedule_time + execute_time + update_time). The fit is non-negative least squares of the
relative error over lab.sim.step_time.profiled.FEATURES; the JSON keeps the coefficients, the feature
names, where they were measured (model, device, dtype, attention, machine) and the fit's error.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from lab.config.compose import load_run_config
from lab.core.step import StepShape
from lab.sim.step_time.profiled import FEATURES, features, fit

STEPS_FILE = "steps.jsonl"


def step_shape(record: dict[str, Any]) -> StepShape:
    """The StepShape of a steps.jsonl record."""
    return StepShape(
        num_tokens=record["num_scheduled_tokens"], num_prefill_reqs=record["num_prefill_reqs"],
        num_decode_reqs=record["num_decode_reqs"],
        prefill_attention_pairs=record["prefill_attention_pairs"],
        decode_context_tokens=record["decode_context_tokens"],
        swap_in_blocks=record.get("swap_in_blocks", 0),
        swap_out_blocks=record.get("swap_out_blocks", 0))


def step_seconds(record: dict[str, Any], previous: dict[str, Any] | None = None) -> float:
    """What the simulator's clock must advance by for this step: the time since the previous
    step ended when the engine was busy in between (the whole loop: schedule, execute, update,
    outputs, loggers, the replay), else (after an idle wait, or the first step) the step's own
    schedule + execute + update time."""
    busy = previous is not None and (previous["num_running_reqs"] + previous["num_waiting_reqs"]
                                     + previous.get("num_swapped_reqs", 0)) > 0
    if busy:
        return record["time"] - previous["time"]
    return record["schedule_time"] + record["execute_time"] + record.get("update_time", 0.0)


def load_steps(run_dir: Path, skip_first: int = 1) -> tuple[list[StepShape], list[float]]:
    """Shapes and times of a run's steps, without the first `skip_first` (warm-up)."""
    lines = (Path(run_dir) / STEPS_FILE).read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    previous = [None, *records[:-1]]
    pairs = list(zip(records, previous))[skip_first:]
    return [step_shape(r) for r, _ in pairs], [step_seconds(r, p) for r, p in pairs]


def provenance(run_dirs: list[Path]) -> dict[str, Any]:
    """What the profile was measured on: each run's model, device, dtype and attention."""
    runs = []
    for d in run_dirs:
        try:
            cfg, choices = load_run_config(d)
        except FileNotFoundError:
            runs.append({"run_dir": str(d)})
            continue
        model = cfg.get("model", {})
        runs.append({"run_dir": str(d), "model": model.get("name") or model.get("path"),
                     "device": cfg.get("device"), "dtype": cfg.get("dtype"),
                     "attention": choices.get("attention"), "executor": choices.get("executor")})
    models = sorted({str(r.get("model")) for r in runs})
    return {"model": models[0] if len(models) == 1 else models, "runs": runs,
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
            "created": datetime.now(UTC).isoformat(timespec="seconds")}


def fit_profile(run_dirs: list[Path], skip_first: int = 1) -> dict[str, Any]:
    """Fit the profiled step-time model to the runs' steps; the profile as a JSON-able dict."""
    shapes, times = [], []
    for d in run_dirs:
        s, t = load_steps(d, skip_first)
        shapes += s
        times += t
    if len(shapes) < len(FEATURES):
        raise ValueError(f"{len(shapes)} steps in {len(run_dirs)} run(s): too few to fit "
                         f"{len(FEATURES)} coefficients")
    x = np.array([features(s) for s in shapes])
    coef, error = fit(x, np.array(times))
    return {"kind": "lab.sim.step_time.profiled", "features": list(FEATURES),
            "coefficients": [float(c) for c in coef], "fit": error, **provenance(run_dirs)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("run_dirs", nargs="+", type=Path)
    p.add_argument("-o", "--output", type=Path, default=Path("profile.json"))
    p.add_argument("--skip-first", type=int, default=1, help="warm-up steps dropped per run")
    args = p.parse_args(argv)
    profile = fit_profile(args.run_dirs, args.skip_first)
    args.output.write_text(json.dumps(profile, indent=2) + "\n")
    terms = "  ".join(f"{n}={c:.3g}" for n, c in zip(profile["features"],
                                                       profile["coefficients"]))
    fit_ = profile["fit"]
    print(f"{fit_['num_steps']} steps: {terms}\nrmse {fit_['rmse_s'] * 1e3:.3f} ms  "
          f"mape {100 * fit_['mape']:.1f}%  r2 {fit_['r2']:.3f}  -> {args.output}")


if __name__ == "__main__":
    main()
