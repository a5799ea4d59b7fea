"""`python run.py -m` with two jobs and logger=[jsonl,wandb] (offline): two run directories,
two offline W&B runs, each with its own config, the group choices as tags, one sweep group."""

import json
import os
from pathlib import Path

import pytest

from tests.metrics.wandb_reader import find_run_file, read_run
from tests.procs import run_python

pytest.importorskip("wandb")
REPO = Path(__file__).resolve().parents[2]


def test_multirun_two_jobs_two_offline_runs(tmp_path):
    sweep = tmp_path / "sweep"
    cmd = ["run.py", "-m", "num_gpu_blocks=48,96", "scheduler=fcfs",
           "workload.num_requests=4", "workload.arrival=batch", "workload.output_len.max=20",
           "block_size=4", "max_num_batched_tokens=64", "logger=[jsonl,wandb]",
           "logger.wandb.console=off", f"hydra.sweep.dir={sweep}"]
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    env.pop("WANDB_API_KEY", None)
    proc = run_python(cmd, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert [j.name for j in jobs] == ["0", "1"]
    assert proc.stdout.count("wandb sync ") == 2
    for job, blocks in zip(jobs, (48, 96)):
        summary = json.loads((job / "summary.json").read_text())
        assert summary["num_requests"] == 4
        run = read_run(find_run_file(job))
        assert run.complete, f"{job}: no exit record in the .wandb file"
        assert run.config["num_gpu_blocks"] == blocks
        assert run.config["cache"]["block_size"] == 4 and "slo" in run.config
        tags = set(run.run.tags)
        assert {"attention:auto", "scheduler:fcfs", "model:tiny_llama"} <= tags
        assert run.run.run_group == str(sweep)
        assert run.run.display_name == f"num_gpu_blocks={blocks}"  # the swept key
        steps = [h for h in run.history if "engine/step" in h]
        assert len(steps) == summary["num_steps"]
        assert run.summary["num_requests"] == 4
        assert run.summary["output_throughput"] == summary["output_throughput"]
