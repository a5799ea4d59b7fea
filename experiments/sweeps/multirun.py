"""Run a W&B sweep file offline as the equivalent Hydra multirun (grid sweeps).

    python experiments/sweeps/multirun.py experiments/sweeps/cpu_small.yaml [OVERRIDE ...]
    python experiments/sweeps/multirun.py experiments/sweeps/cpu_small.yaml --dry-run

Each swept parameter `k: {values: [a, b]}` becomes `k=a,b`, each fixed one `k: {value: a}`
becomes `k=a`, and the literal overrides of the sweep's `command:` (everything but the ${...}
macros and run.py) come first; extra command-line overrides come last, so they win. Jobs go to
experiments/sweeps/runs/<sweep name>/<timestamp>/<job number>/; the W&B logger (if listed) runs
offline unless an API key is configured, and a multirun's jobs share one W&B group.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def multirun_overrides(sweep: dict) -> list[str]:
    """The Hydra overrides of a W&B grid sweep (fixed command overrides, then the grid)."""
    if sweep.get("method", "grid") != "grid":
        raise ValueError("only grid sweeps have a Hydra multirun equivalent")
    fixed = [str(a) for a in sweep.get("command", [])
             if "${" not in str(a) and str(a) not in ("run.py", sweep.get("program"))]
    grid = []
    for key, spec in sweep["parameters"].items():
        values = spec["values"] if "values" in spec else [spec["value"]]
        grid.append(f"{key}={','.join(str(v) for v in values)}")
    return fixed + grid


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep", type=Path, help="a W&B sweep YAML")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    p.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    args = p.parse_intermixed_args(argv)
    sweep = yaml.safe_load(args.sweep.read_text())
    out = f"experiments/sweeps/runs/{args.sweep.stem}/{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    cmd = [sys.executable, "run.py", "-m", *multirun_overrides(sweep),
           f"hydra.sweep.dir={out}", *args.overrides]
    print(shlex.join(cmd), flush=True)
    if args.dry_run:
        return 0
    rc = subprocess.run(cmd, cwd=REPO).returncode
    print(f"sweep dir: {out}\nplots:     python -m lab.plots {out} --out {out}/plots")
    return rc


if __name__ == "__main__":
    sys.exit(main())
