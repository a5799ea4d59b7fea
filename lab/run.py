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
from lab.config.validate import (
    SETTING_ERRORS,
    check_command_line,
    refuse,
    refuse_setting_error,
    validate_config,
)
from lab.engine.llm_engine import LLMEngine
from lab.engine.replay import replay
from lab.metrics.jsonl import SUMMARY_FILE

log = logging.getLogger("lab")


def main() -> None:
    """`python run.py` / `lab run`: refuse an unknown setting with the list of knobs (Hydra's own
    hint, `+name=value`, would add a key nothing reads), then run the Hydra job."""
    if any(a in ("-h", "--help") for a in sys.argv[1:]):  # lab's own help, not Hydra's dump
        from lab.config.listing import command_help

        print(command_help("lab run" if sys.argv[0] == "lab run" else "python run.py"))
        sys.exit(0)
    register()  # the knobs' defaults and the plug-ins' search path, for Hydra to compose
    refusal = check_command_line(sys.argv[1:])
    if refusal is not None:
        refuse("run.py", refusal)
    run_job()


@hydra.main(config_path="conf", config_name="config", version_base=None)
def run_job(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        with failure_marked(run_dir, "start"):
            validate_config(cfg)
            say_a_switched_model(hydra_choices())
            demonstration_cache(cfg)
            (run_dir / "config.yaml").write_text(run_config_yaml(cfg, hydra_choices()))
            loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values()]
            engine = LLMEngine(cfg, loggers=loggers)
            requests = instantiate(cfg.workload).requests(
                engine.hf_config.vocab_size, engine.eos_token_id,
                interpreted=engine.triton_interpreted)
    except SETTING_ERRORS as e:
        refuse_setting_error("run.py", e)
    with failure_marked(run_dir, "run"):
        for logger in loggers:
            logger.on_start(run_dir, OmegaConf.to_container(cfg, resolve=True), len(requests))
        summary = replay(engine, requests)
        for logger in loggers:
            logger.close(summary)


def say_a_switched_model(choices: dict[str, str]) -> None:
    """When an option given on the command line chose the model by its defaults (attention=
    triton_mla runs the embedded MLA model), say which model runs and why."""
    given = {o.split("=", 1)[0].lstrip("+~") for o in HydraConfig.get().overrides.task}
    model = choices.get("model")
    if "model" in given or model is None or model == default_option("model"):
        return
    chosen_by = [f"{g}={choices[g]}" for g in sorted(given) if g in choices and g != "model"]
    log.info("model: %s, chosen by the defaults of %s (model=NAME runs another)", model,
             ", ".join(chosen_by) or "an option given")


def default_option(group: str) -> str | None:
    """The option lab/conf/config.yaml's defaults list gives `group`."""
    from lab.config.compose import CONF_DIR

    for entry in OmegaConf.load(Path(CONF_DIR) / "config.yaml").defaults:
        if isinstance(entry, DictConfig) and group in entry:
            return str(entry[group])
    return None


def demonstration_cache(cfg: DictConfig) -> None:
    """On a CPU, unless a KV cache size was given: a cache of one request of the model's
    context (cpu_kv_cache_requests=1), so the default workload, whose requests together want
    more, preempts, as the demonstration means to show; said in the output. LLM(...) and
    `lab serve` size their cache from memory instead (lab.cache.sizing.cpu_kv_bytes)."""
    from lab.platform import resolve_device

    given = ("num_gpu_blocks", "cpu_kv_cache_gb", "cpu_kv_cache_requests")
    if resolve_device(cfg.device).type != "cpu" or any(cfg.get(k) is not None for k in given):
        return
    cfg.cpu_kv_cache_requests = 1
    log.info("KV cache: one request of the model's context (cpu_kv_cache_requests=1, run.py's "
             "demonstration: its workload preempts); cpu_kv_cache_requests=N, cpu_kv_cache_gb="
             "GiB or num_gpu_blocks=N size it, and LLM(...) and lab serve size it from memory")


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
