"""WandbLogger: an offline W&B run of the scripted workload, read back from its `.wandb` file.

Relies on wandb 0.31.0 (the version these tests were written against; pyproject asks >= 0.22):
offline runs live in `<dir>/wandb/offline-run-*/run-*.wandb`, a LevelDB-style log of
`wandb.proto.wandb_internal_pb2.Record` (run, config, metric, history, summary records), which
tests/metrics/wandb_reader.py parses (wandb no longer ships a Python reader for it).
"""

import re
import subprocess
import sys

import pytest

from lab.metrics import InMemoryLogger
from lab.metrics.wandb_logger import (
    StepDecimator,
    WandbLogger,
    has_wandb_credentials,
    resolve_mode,
    wandb_step_record,
)
from tests.metrics.scripted import run_script
from tests.metrics.wandb_reader import find_run_file, read_run

wandb = pytest.importorskip("wandb")
WANDB_TESTED = "0.31.0"
CONFIG = {"attention": {"_target_": "lab.attention.torch_backend.TorchBackend"},
          "num_gpu_blocks": 6, "slo": {"ttft_s": 0.5, "tpot_s": 0.25, "e2e_s": None}}


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("wandb_job")
    mem = InMemoryLogger()
    logger = WandbLogger(project="lab-tests", mode="offline", console="off", tags=["scripted"],
                         choices={"scheduler": "fcfs", "attention": "torch"})
    summary = run_script([mem, logger], run_dir, config=CONFIG)
    return mem, summary, run_dir, read_run(find_run_file(run_dir))


def test_run_record_config_and_tags(offline_run):
    _, _, _, run = offline_run
    assert run.complete, "no exit record in the .wandb file"
    assert list(run.run.tags) == ["attention:torch", "scheduler:fcfs", "scripted"]
    assert run.run.project == "lab-tests"
    config = {k: v for k, v in run.config.items() if k != "_wandb"}
    assert config == CONFIG, f"wandb {wandb.__version__} (tested: {WANDB_TESTED})"


def test_metric_definitions_use_engine_step(offline_run):
    _, _, _, run = offline_run
    assert "engine/step" in run.metrics
    for glob in ("engine/*", "sched/*", "kv/*"):
        assert run.metrics[glob].glob_name == glob
        assert run.metrics[glob].step_metric == "engine/step"
    assert run.metrics["kv/kv_cache_usage"].summary.max


def test_history_is_every_step_exactly(offline_run):
    mem, _, _, run = offline_run
    rows = [h for h in run.history if "engine/step" in h]
    want = [wandb_step_record(s.to_dict()) for s in mem.steps]
    assert [{k: r[k] for k in w} for r, w in zip(rows, want)] == want and len(rows) == 6
    assert [r["sched/num_running_reqs"] for r in rows] == [2, 2, 2, 0, 1, 0]
    assert [r["sched/num_waiting_reqs"] for r in rows] == [0, 0, 1, 2, 0, 0]
    assert [r["sched/num_prefill_tokens"] for r in rows] == [8, 7, 1, 0, 5, 0]
    assert [r["sched/num_decode_tokens"] for r in rows] == [0, 1, 1, 1, 1, 1]
    assert [r["kv/kv_blocks_used"] for r in rows] == [3, 5, 5, 0, 2, 0]
    assert [r["kv/prefix_cache_hits"] for r in rows] == [0, 0, 4, 0, 12, 0]
    assert rows[3]["sched/preempted_by_strategy/recompute"] == 1


def test_request_table_and_histograms(offline_run):
    import json

    _, _, run_dir, run = offline_run
    last = run.history[-1]
    assert last["requests/_type"] == "table-file" and last["requests/nrows"] == 3
    table = json.loads(next(run_dir.glob("wandb/offline-run-*/files/" + last["requests/path"]))
                       .read_text())
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    assert [(r["request_id"], r["ttft"], r["num_output_tokens"]) for r in rows] == [
        ("A", 0.25, 4), ("B", 0.75, 2), ("C", 0.75, 2)]
    assert [r["itl_max"] for r in rows] == [0.25, 0.5, 0.25]
    counts = {k: sum(last[f"latency/{k}_s/values"]) for k in ("ttft", "tpot", "itl", "e2e")}
    assert counts == {"ttft": 3, "tpot": 3, "itl": 5, "e2e": 3}


def test_summary_holds_the_run_summary(offline_run):
    _, summary, _, run = offline_run
    for key, value in summary.to_dict().items():
        assert run.summary[key] == value, key
    assert run.summary["request_goodput"] == pytest.approx(1 / 1.5)
    assert run.summary["peak_kv_cache_usage"] == 1.0 and run.summary["num_preemptions"] == 1
    assert run.summary["kv/kv_cache_usage"] == {"max": 1.0}


def test_offline_prints_sync_command(tmp_path, capsys):
    logger = WandbLogger(mode="offline", console="off", choices={})
    run_script([logger], tmp_path)
    out = capsys.readouterr().out
    match = re.search(r"wandb sync (\S+)", out)
    assert match and match.group(1) == str(find_run_file(tmp_path).parent)


def test_decimation_windows(offline_run):
    mem, _, _, _ = offline_run
    records = [s.to_dict() for s in mem.steps]
    # windows: 0 | 1 | 2-3 | 4-5 (doubled after 2 points)
    dec = StepDecimator(log_every_steps=1, decimate_after=2)
    points = [p for r in records if (p := dec.add(r)) is not None]
    assert dec.flush() is None
    assert [p["step"] for p in points] == [0, 1, 3, 5]
    assert [p["num_scheduled_tokens"] for p in points] == [8, 8, 3, 7]  # counts summed
    assert [p["num_preempted"] for p in points] == [0, 0, 1, 0]
    assert [p["preempted_by_strategy"] for p in points] == [{}, {}, {"recompute": 1}, {}]
    assert [p["kv_blocks_used"] for p in points] == [3, 5, 0, 0]  # gauges: last step
    assert [p["num_waiting_reqs"] for p in points] == [0, 0, 2, 0]
    # fixed windows of 4, never doubled: 0-3 | 4-5 (flushed at the end)
    dec = StepDecimator(log_every_steps=4, decimate_after=None)
    points = [p for r in records if (p := dec.add(r)) is not None] + [dec.flush()]
    assert [(p["step"], p["prefix_cache_queries"]) for p in points] == [(3, 23), (5, 18)]
    with pytest.raises(ValueError, match="log_every_steps"):
        StepDecimator(log_every_steps=0)


def test_resolve_mode(tmp_path):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    missing = str(tmp_path / "none")
    assert resolve_mode("auto", {"NETRC": missing}) == "offline"
    assert resolve_mode("auto", {"NETRC": missing, "WANDB_API_KEY": "k"}) == "online"
    assert resolve_mode("auto", {"NETRC": str(netrc)}) == "online"
    assert not has_wandb_credentials({"NETRC": str(netrc), "WANDB_BASE_URL": "https://w.example"})
    assert resolve_mode("auto", {"WANDB_MODE": "disabled", "WANDB_API_KEY": "k"}) == "disabled"
    assert resolve_mode("offline", {"WANDB_API_KEY": "k"}) == "offline"
    with pytest.raises(ValueError, match="mode"):
        WandbLogger(mode="cloud")


def test_wandb_imported_only_when_used():
    code = ("import sys, lab.metrics, lab.metrics.wandb_logger as w; w.WandbLogger(); "
            "from lab.config.compose import compose_config; "
            "compose_config(['logger=[console,jsonl,prometheus,wandb]']); "
            "print('wandb' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
