"""Compose an engine with Hydra, run a workload through it, write its statistics.

    python run.py                                   # tiny Llama, synthetic workload
    python run.py model=hf model.path=DIR workload.num_requests=32
    python run.py -m num_gpu_blocks=32,64,128       # a sweep
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from lab.engine.llm_engine import LLMEngine
from lab.engine.replay import replay

log = logging.getLogger("lab")


@hydra.main(config_path="conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    loggers = [instantiate(c) for c in (cfg.logger or {}).values()]
    engine = LLMEngine(cfg, loggers=loggers)
    requests = instantiate(cfg.workload).requests(engine.hf_config.vocab_size, engine.eos_token_id)
    for logger in loggers:
        logger.on_start(run_dir, OmegaConf.to_container(cfg, resolve=True), len(requests))
    summary = replay(engine, requests)
    for logger in loggers:
        logger.close(summary)


if __name__ == "__main__":
    main()
