"""The table that ends a multirun (`python run.py -m KNOB=A,B ...`): one row per job, the
settings the sweep varied and the job's headline numbers, read back from each job's summary.json (the
jsonl logger's), printed and written beside the jobs as comparison.md and comparison.csv.

A Hydra callback (lab/conf/config.yaml, `hydra.callbacks.compare_jobs`): it runs once, after
the last job, in the process that launched them (the basic launcher's, or the sweeper's).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from lab.metrics.jsonl import SUMMARY_FILE

#: (column, summary.json field, format) of the numbers each job's row shows
COLUMNS = (
    ("output tok/s", "output_throughput", "{:.1f}"),
    ("TTFT p50 ms", "ttft_p50", "ms"),
    ("TPOT p50 ms", "tpot_p50", "ms"),
    ("E2E p50 ms", "e2e_p50", "ms"),
    ("preemptions", "num_preemptions", "{}"),
    ("prefix hit rate", "prefix_cache_hit_rate", "{:.1%}"),
    ("time s", "wall_time", "{:.2f}"),
)


def job_rows(sweep_dir: Path) -> list[dict[str, str]]:
    """One row per job directory of the sweep (in job order): the value of each setting the
    jobs do not share (what the sweep varied), the job's status when not every job finished,
    and its numbers ('-' where the job wrote no summary: it failed before it, or ran without
    the jsonl logger)."""
    jobs = sorted((d for d in sweep_dir.iterdir() if d.is_dir() and d.name.isdigit()),
                  key=lambda d: int(d.name))
    settings = [_overrides(job) for job in jobs]
    varied = [k for k in dict.fromkeys(k for s in settings for k in s)
              if len({s.get(k) for s in settings}) > 1]
    summaries = [_read(job / SUMMARY_FILE) for job in jobs]
    statuses = [s.get("status", "no summary") if s else "no summary" for s in summaries]
    rows = []
    for job, setting, summary, status in zip(jobs, settings, summaries, statuses):
        row = {"job": job.name, **{k: setting.get(k, "-") for k in varied}}
        if set(statuses) != {"finished"}:
            row["status"] = status
        for name, key, fmt in COLUMNS:
            row[name] = _format(summary.get(key), fmt)
        rows.append(row)
    return rows


def _overrides(job: Path) -> dict[str, str]:
    """The job's command-line settings, {key: value} (Hydra's .hydra/overrides.yaml)."""
    path = job / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return {}
    return dict(o.split("=", 1) if "=" in o else (o, "") for o in OmegaConf.load(path))


NUMBERS = {name for name, _, _ in COLUMNS}


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _format(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if fmt == "ms":
        return f"{1e3 * value:.1f}"
    return fmt.format(value)


def comparison_table(rows: list[dict[str, str]]) -> Table:
    table = Table(title="multirun: jobs compared")
    for column in rows[0]:
        table.add_column(column, justify="right" if column in NUMBERS else "left")
    for row in rows:
        table.add_row(*row.values())
    return table


def write_comparison(sweep_dir: Path, rows: list[dict[str, str]]) -> None:
    """comparison.csv and comparison.md in the sweep directory."""
    with open(sweep_dir / "comparison.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(row.values()) + " |" for row in rows]
    (sweep_dir / "comparison.md").write_text("\n".join(lines) + "\n")


class CompareJobs(Callback):
    """Prints and writes the comparison of a multirun's jobs when the multirun ends."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        rows = job_rows(sweep_dir)
        if not rows:
            return
        write_comparison(sweep_dir, rows)
        console = Console(width=max(Console().width, 160))  # a table wider than a pipe's 80
        console.print(comparison_table(rows))
        console.print(f"written: {sweep_dir / 'comparison.md'}", soft_wrap=True, markup=False,
                      highlight=False)
