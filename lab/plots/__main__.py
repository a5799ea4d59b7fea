"""Plot one or more runs (or multirun sweep directories) into PNG files.

    python -m lab.plots outputs/2026-12-03/10-00-00                      # -> <run>/plots/
    python -m lab.plots multirun/2026-12-03/10-00-00 --out plots/sweep   # every job of a sweep
    python -m lab.plots RUN_A RUN_B --out plots/compare

Writes timeline_<n>_<label>.png per run (KV usage, running / waiting / swapped requests,
prefill vs decode tokens per step, preemptions marked), latency_cdf.png (TTFT / TPOT / E2E) and
throughput_goodput.png. Runs are labelled by the settings that differ between them.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from lab.plots.data import load_runs
from lab.plots.figures import plot_all


def main(argv: list[str] | None = None) -> list[Path]:
    p = argparse.ArgumentParser(prog="python -m lab.plots", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="run directories or sweep directories")
    p.add_argument("--out", type=Path, default=None,
                   help="output directory (default: <run>/plots for one path, else "
                        "<common parent>/plots)")
    args = p.parse_args(argv)
    runs = load_runs(args.runs)
    out = args.out or default_out(args.runs)
    files = plot_all(runs, out)
    for f in files:
        print(f)
    return files


def default_out(paths: list[Path]) -> Path:
    if len(paths) == 1:
        return paths[0] / "plots"
    return Path(os.path.commonpath([str(p.resolve()) for p in paths])) / "plots"


if __name__ == "__main__":
    main()
