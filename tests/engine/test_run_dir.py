"""What `python run.py` leaves in its run directory: config.yaml with the option of every group
(loadable again), a summary with per-priority TTFT and the warm-up's seconds, steps.jsonl without
the warm-up's steps; and a failed run marked as failed."""

import json
import subprocess
from pathlib import Path

import pytest

from lab import run
from lab.config.compose import load_run_config
from lab.config.validate import validate_config
from tests.procs import run_python

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    return run_python(["run.py", *overrides, f"hydra.run.dir={tmp_path}"], cwd=REPO)


def test_a_run_records_every_choice_and_ttft_by_priority(tmp_path):
    proc = _run(tmp_path, "scheduler=priority", "workload.num_requests=9",
                "workload.arrival=batch", "max_num_batched_tokens=128", "logger=[console,jsonl]")
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg, choices = load_run_config(tmp_path)
    assert choices["scheduler"] == "priority" and choices["model"] == "tiny_llama"
    assert choices["attention"] == "auto" and choices["logger"] == ["console", "jsonl"]
    validate_config(cfg)  # what the engine ran, loadable again
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "finished"
    by_prio = summary["ttft_by_priority"]
    assert list(by_prio) == ["0", "1", "2"] and sum(d["count"] for d in by_prio.values()) == 9
    assert all(d["p50"] > 0 and d["p99"] >= d["p90"] >= d["p50"] for d in by_prio.values())
    out = proc.stdout + proc.stderr
    assert "TTFT priority 0" in out and "TTFT priority 2" in out and "no SLO set" in out
    # the warm-up ran before the run's clock, and the run's records count none of it
    assert summary["warmup_seconds"] > 0 and summary["warmup_steps"] > 0
    assert f"warm-up: {summary['warmup_steps']} steps in" in out
    steps = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert steps[0]["step"] == 0 and len(steps) == summary["num_steps"]
    assert not any(r.startswith("warmup-") for s in steps for r in s["scheduled_req_ids"])


def test_a_failed_start_is_marked_failed_and_names_the_key(tmp_path):
    proc = _run(tmp_path, "+not_a_knob=1")
    assert proc.returncode != 0
    assert "unknown setting 'not_a_knob'" in proc.stderr and "max_num_seqs" in proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["stage"] == "start"
    assert "not_a_knob" in summary["error"]
    assert not (tmp_path / "config.yaml").exists() and not (tmp_path / "steps.jsonl").exists()


def test_a_failure_midway_is_marked_with_its_stage(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with run.failure_marked(tmp_path, "run"):
            raise RuntimeError("boom")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == {"status": "failed", "stage": "run", "error": "RuntimeError: boom"}


def test_a_plain_unknown_override_is_refused_with_the_knobs(tmp_path):
    """`not_a_knob=1` (no +) is refused by run.py itself: Hydra's own error suggested
    `+not_a_knob=1`, a key nothing reads."""
    proc = _run(tmp_path, "not_a_knob=1")
    assert proc.returncode == 2
    assert "unknown setting 'not_a_knob'" in proc.stderr and "max_num_seqs" in proc.stderr
    assert "+not_a_knob" not in proc.stderr


def test_a_bad_setting_found_while_starting_is_one_line_and_exit_2(tmp_path):
    """A knob out of range (refused when the job starts, after Hydra composed it) used to end in
    a traceback with exit code 1; `model=hf` without model.path and a missing model directory
    in ~20 lines of omegaconf internals."""
    proc = _run(tmp_path, "max_num_seqs=0")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "run.py: max_num_seqs=0 is invalid: must be an integer >= 1")


@pytest.mark.parametrize(("args", "refused"), [
    (["not_a_knob=1"], "unknown setting 'not_a_knob'"),
    (["-m", "block_size=8,16", "bogus.x=2"], "unknown setting 'bogus'"),
    (["scheduler=priority", "slo.ttft_s=1", "hydra.run.dir=x", "+new=1", "logger=[jsonl]"], None),
    (["model.path=/x", "workload.num_requests=3", "max_num_seqs=4"], None),
    (["max_num_seq=4"], "(did you mean max_num_seqs?)"),
    (["attention=torchh"], "attention=torchh is not an option of attention: auto, cpu, torch, "
                           "triton_flash, triton_mla (did you mean torch?)"),
    (["sim/step_time=profild"], "(did you mean profiled?)"),
    (["sim/step_time=profiled", "cache/eviction=lfu", "model=null"], None),
    (["hydra.searchpath=[file://mine]", "scheduler=my_policy"], None),  # its own options
])
def test_command_line_check(args, refused):
    from lab.config.validate import check_command_line

    message = check_command_line(args)
    assert (message is None) if refused is None else refused in message
