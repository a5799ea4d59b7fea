"""Compose an engine with Hydra, run a workload through it, write its statistics.

    python run.py                                   # tiny Llama, synthetic workload
    python run.py model=hf model.path=DIR workload.num_requests=32
    python run.py -m num_gpu_blocks=32,64,128       # a sweep

The run directory (Hydra's output dir) gets config.yaml (the resolved config + `choices`, the
option of every group; lab.config.compose.run_config_yaml) and what the loggers write. A run that
fails — at the start (a bad knob, model or backend) or midway — gets a summary.json saying so:
{"status": "failed", "stage": "start" | "run", "error": "..."}; a finished run's summary.json
(logger jsonl) has "status": "finished".
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from lab.config.compose import hydra_choices, register, run_config_yaml
from lab.config.validate import check_command_line, validate_config
from lab.engine.llm_engine import LLMEngine
from lab.engine.replay import replay
from lab.metrics.jsonl import SUMMARY_FILE

log = logging.getLogger("lab")


def main() -> None:
    """`python run.py` / `lab run`: refuse an unknown setting with the list of knobs (Hydra's own
    hint, `+name=value`, would add a key nothing reads), then run the Hydra job."""
    register()  # the knobs' defaults and the plug-ins' search path, for Hydra to compose
    refusal = check_command_line(sys.argv[1:])
    if refusal is not None:
        sys.exit(f"run.py: {refusal}")
    run_job()


@hydra.main(config_path="conf", config_name="config", version_base=None)
def run_job(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    with failure_marked(run_dir, "start"):
        validate_config(cfg)
        (run_dir / "config.yaml").write_text(run_config_yaml(cfg, hydra_choices()))
        loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values()]
        engine = LLMEngine(cfg, loggers=loggers)
        requests = instantiate(cfg.workload).requests(
            engine.hf_config.vocab_size, engine.eos_token_id, interpreted=engine.triton_interpreted)
    with failure_marked(run_dir, "run"):
        for logger in loggers:
            logger.on_start(run_dir, OmegaConf.to_container(cfg, resolve=True), len(requests))
        summary = replay(engine, requests)
        for logger in loggers:
            logger.close(summary)


@contextmanager
def failure_marked(run_dir: Path, stage: str) -> Iterator[None]:
    """On an exception inside, write summary.json {"status": "failed", "stage", "error"} into
    the run directory (so it is not taken for a finished run), then let the exception go on."""
    try:
        yield
    except BaseException as e:
        record = {"status": "failed", "stage": stage, "error": f"{type(e).__name__}: {e}"}
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / SUMMARY_FILE).write_text(json.dumps(record, indent=2) + "\n")
        raise


if __name__ == "__main__":
    main()
