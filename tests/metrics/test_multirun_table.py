"""A multirun ends with one table comparing its jobs (lab/metrics/multirun.py): the settings the
sweep varied and each job's numbers, printed and written beside the jobs."""

import csv
import json
from pathlib import Path

from lab.metrics.multirun import job_rows
from tests.procs import run_python

REPO = Path(__file__).resolve().parents[2]


def test_a_multirun_prints_and_writes_the_comparison(tmp_path):
    cmd = ["run.py", "-m", "workload.num_requests=3", "num_gpu_blocks=24,48",
           "block_size=4", "logger=[jsonl]", f"hydra.sweep.dir={tmp_path}"]
    proc = run_python(cmd, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "multirun: jobs compared" in proc.stdout
    rows = list(csv.DictReader(open(tmp_path / "comparison.csv")))
    assert [(r["job"], r["num_gpu_blocks"]) for r in rows] == [("0", "24"), ("1", "48")]
    assert "block_size" not in rows[0]  # shared by every job: not a column
    for row in rows:
        summary = json.loads((tmp_path / row["job"] / "summary.json").read_text())
        assert row["output tok/s"] == f"{summary['output_throughput']:.1f}"
        assert row["preemptions"] == str(summary["num_preemptions"])
    assert (tmp_path / "comparison.md").read_text().startswith("| job | num_gpu_blocks |")


def test_a_job_without_a_summary_shows_its_status(tmp_path):
    for job, blocks in (("0", "24"), ("1", "48")):
        (tmp_path / job / ".hydra").mkdir(parents=True)
        (tmp_path / job / ".hydra" / "overrides.yaml").write_text(f"- num_gpu_blocks={blocks}\n")
    (tmp_path / "0" / "summary.json").write_text(json.dumps(
        {"status": "finished", "output_throughput": 10.0, "num_preemptions": 2}))
    rows = job_rows(tmp_path)
    assert [r["status"] for r in rows] == ["finished", "no summary"]
    assert rows[0]["output tok/s"] == "10.0" and rows[1]["output tok/s"] == "-"
