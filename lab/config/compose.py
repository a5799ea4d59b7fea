"""Hydra composition shared by run.py, the offline LLM API, benchmarks and tests."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf, open_dict

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"  # lab/conf: lab's own options
GROUPS = ("model", "attention", "kernels", "quant", "scheduler", "preemption", "cache", "workload",
          "executor", "logger", "logits_processors", "sim/step_time", "cache/eviction")


def without_loggers_unless_given(overrides: list[str]) -> list[str]:
    """Embedded engines (LLM, lab serve) log nowhere unless a `logger=` override asks."""
    if any(o.lstrip("+~").startswith("logger=") for o in overrides):
        return list(overrides)
    return [*overrides, "logger=[]"]


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    """Compose lab/conf/config.yaml with Hydra command-line style overrides (no output dir)."""
    return compose_with_choices(overrides)[0]


def compose_with_choices(overrides: list[str] | None = None) -> tuple[DictConfig, dict[str, str]]:
    """compose_config, plus the option chosen in every group (as hydra_choices gives inside a
    Hydra job), for a run directory's config.yaml outside one (lab serve)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=list(overrides or []),
                      return_hydra_config=True)
    choices = group_choices(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices


@cache
def declared_knobs() -> dict[str, Any]:
    """The knobs lab/conf/config.yaml declares (top-level keys that are not groups), with their
    defaults as plain values. Only these are knobs: a `+key` added by an override is not."""
    raw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"), resolve=False)
    return {k: v for k, v in raw.items() if k not in ("defaults", "hydra", *GROUPS)}


def is_known_setting(key: str) -> bool:
    """Whether a top-level key is a config group, `hydra`, or a declared knob."""
    return key in GROUPS or key == "hydra" or key in declared_knobs()


def nested_groups(key: str) -> set[str]:
    """The keys of a knob block that are config groups: {"step_time"} for `sim` (the group
    `sim/step_time` lives at `sim.step_time`)."""
    return {g.split("/", 1)[1] for g in GROUPS if g.startswith(f"{key}/")}


def set_knobs(cfg: DictConfig, knobs: dict[str, object]) -> DictConfig:
    """Set engine knobs (or dotted paths such as model.path) by name, refusing unknown names."""
    for key, value in knobs.items():
        if not is_known_setting(key.split(".", 1)[0]) or key in GROUPS:
            raise ValueError(unknown_setting_message(key, list(declared_knobs())))
        with open_dict(cfg):
            OmegaConf.update(cfg, key, value, merge=False)
    return cfg


def unknown_setting_message(key: str, knobs: list[str]) -> str:
    """The refusal of a setting that is neither a config group nor an engine knob."""
    return (f"unknown setting {key!r}: config groups are {', '.join(GROUPS)}; engine knobs are "
            f"{', '.join(sorted(knobs))}")


def hydra_choices() -> dict[str, str]:
    """The option chosen in every config group of the running Hydra job ({} outside Hydra).
    A list-valued group (`logger=[console,jsonl]`) is not among Hydra's choices."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    return group_choices(HydraConfig.get().runtime.choices)


def group_choices(choices: Any) -> dict[str, str]:
    """{group: option} from Hydra's runtime choices, without Hydra's own groups and unset ones."""
    return {k: str(v) for k, v in choices.items() if not k.startswith("hydra/") and v is not None}


RUN_CHOICES_KEY = "choices"


def run_config_yaml(cfg: DictConfig, choices: dict[str, str]) -> str:
    """The text of a run directory's config.yaml: the resolved config the engine ran, plus one
    top-level mapping `choices:` {group: option} naming the option of every group (`logger`: the
    list of loggers), e.g. `choices: {attention: triton_mla, model: tiny_deepseek, ...,
    logger: [console, jsonl]}`. `load_run_config` splits the two again."""
    data = OmegaConf.to_container(cfg, resolve=True)
    data[RUN_CHOICES_KEY] = {**choices, "logger": list(cfg.get("logger") or {})}
    return OmegaConf.to_yaml(data)


def load_run_config(path: str | Path) -> tuple[DictConfig, dict[str, Any]]:
    """A run directory's config.yaml (or the directory) -> (the config the engine ran, which
    `LLMEngine` accepts again; the `choices` mapping, {} in a config.yaml without one)."""
    path = Path(path)
    cfg = OmegaConf.load(path / "config.yaml" if path.is_dir() else path)
    choices = OmegaConf.to_container(cfg.get(RUN_CHOICES_KEY) or OmegaConf.create({}))
    with open_dict(cfg):
        cfg.pop(RUN_CHOICES_KEY, None)
    return cfg, choices
