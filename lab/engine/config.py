"""Hydra composition shared by run.py, the offline LLM API, benchmarks and tests."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf, open_dict

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
GROUPS = ("model", "attention", "kernels", "quant", "scheduler", "preemption", "cache", "workload", "executor", "logger")


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    """Compose conf/config.yaml with Hydra command-line style overrides (no output dir)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name="config", overrides=list(overrides or []))


def engine_knobs(cfg: DictConfig) -> list[str]:
    """The top-level scalar settings of config.yaml (everything that is not a group)."""
    return [k for k in cfg if k not in GROUPS and k != "hydra"]


def set_knobs(cfg: DictConfig, knobs: dict[str, object]) -> DictConfig:
    """Set engine knobs (or dotted paths such as model.path) by name, refusing unknown names."""
    known = engine_knobs(cfg)
    for key, value in knobs.items():
        if "." not in key and key not in known:
            raise ValueError(
                f"unknown setting {key!r}: config groups are {', '.join(GROUPS)}; "
                f"engine knobs are {', '.join(sorted(known))}"
            )
        with open_dict(cfg):
            OmegaConf.update(cfg, key, value, merge=False)
    return cfg
