"""JsonlLogger, ConsoleLogger and InMemoryLogger; the logger YAMLs compose side by side."""

import json
import logging
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from lab.metrics import (
    ConsoleLogger,
    InMemoryLogger,
    JsonlLogger,
    RequestStats,
    StatLogger,
    StepStats,
    summarize,
)

REPO = Path(__file__).resolve().parents[2]


def _records() -> tuple[list[StepStats], list[RequestStats]]:
    steps = [
        StepStats(step=i, time=1.0 * (i + 1), num_running_reqs=2, num_waiting_reqs=1,
                  num_prefill_tokens=100, num_generated_tokens=2, kv_cache_usage=0.5,
                  prefix_cache_queries=100, prefix_cache_hits=25, num_scheduled_reqs=2,
                  num_preempted=int(i == 1), preempted_by_strategy={"recompute": int(i == 1)})
        for i in range(4)
    ]
    reqs = [RequestStats(request_id=str(i), arrival_time=0.0, ttft=0.1 * (i + 1), tpot=0.01,
                         itl=[0.01, 0.01], e2e_latency=1.0, num_prompt_tokens=10,
                         num_output_tokens=3, finish_reason="length") for i in range(2)]
    return steps, reqs


def _drive(logger: StatLogger, run_dir: Path) -> None:
    steps, reqs = _records()
    logger.on_start(run_dir, {"seed": 0}, total_requests=len(reqs))
    for st in steps:
        logger.on_step(st)
    for rq in reqs:
        logger.on_request(rq)
    logger.close(summarize(steps, reqs, wall_time=4.0))


def test_jsonl_logger_writes_exact_lines(tmp_path):
    _drive(JsonlLogger(), tmp_path / "run")
    steps, reqs = _records()
    lines = (tmp_path / "run" / "steps.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == [st.to_dict() for st in steps]
    lines = (tmp_path / "run" / "requests.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == [rq.to_dict() for rq in reqs]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["output_throughput"] == pytest.approx(1.5)
    assert summary["prefix_cache_hit_rate"] == pytest.approx(0.25)
    assert summary["num_preemptions"] == 1 and summary["num_finished"] == {"length": 2}


def test_jsonl_logger_is_incremental(tmp_path):
    logger = JsonlLogger(flush_every=1)
    logger.on_start(tmp_path)
    logger.on_step(StepStats(step=7))
    assert json.loads((tmp_path / "steps.jsonl").read_text())["step"] == 7  # before close
    logger.close(summarize([], [], 1.0))


def test_jsonl_logger_errors(tmp_path):
    with pytest.raises(ValueError, match="flush_every"):
        JsonlLogger(flush_every=0)
    with pytest.raises(RuntimeError, match="on_start"):
        JsonlLogger().on_step(StepStats())


def test_console_logger_prints_summary_and_run_dir(tmp_path, capsys):
    logger = ConsoleLogger(interval_s=2.0, progress=True)
    _drive(logger, tmp_path / "some_run")
    out, err = capsys.readouterr()
    assert f"run directory: {tmp_path / 'some_run'}" in out
    assert "output tok/s" in out and "prefix-cache hit rate" in out and "25.0%" in out
    # steps at t=2 and t=4 close 2-second intervals of 200 prompt / 4 generated tokens
    assert out.count("Avg prompt throughput: 100.0 tokens/s") == 2  # tqdm.write -> stdout
    assert "Avg generation throughput: 2.0 tokens/s" in out and "Running: 2 reqs" in out
    assert "KV cache usage: 50.0%" in out and "Prefix cache hit rate: 25.0%" in out
    assert "2/2" in err  # the progress bar


def test_console_logger_without_progress_uses_logging(tmp_path, capsys, caplog):
    logger = ConsoleLogger(interval_s=0.5, progress=False)
    logger.set_total(2)
    with caplog.at_level(logging.INFO, logger="lab.metrics.console"):
        _drive(logger, tmp_path)
    assert sum("Avg prompt throughput" in r.message for r in caplog.records) == 4
    assert "Preemptions: 1" in caplog.records[-1].message
    out, _ = capsys.readouterr()
    assert f"run directory: {tmp_path}" in out


def test_in_memory_logger_keeps_records(tmp_path):
    logger = InMemoryLogger()
    _drive(logger, tmp_path)
    steps, reqs = _records()
    assert logger.steps == steps and logger.requests == reqs
    assert logger.total_requests == 2 and logger.config == {"seed": 0}
    assert logger.summary is not None and logger.summary.num_requests == 2


def test_logger_yamls_compose_together(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "lab" / "conf" / "logger", conf / "logger")
    (conf / "config.yaml").write_text("defaults:\n  - logger: [console, jsonl]\n  - _self_\n")
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        cfg = compose(config_name="config")
    loggers = {name: instantiate(c) for name, c in cfg.logger.items()}
    assert isinstance(loggers["console"], ConsoleLogger)
    assert isinstance(loggers["jsonl"], JsonlLogger) and loggers["jsonl"].flush_every == 1
