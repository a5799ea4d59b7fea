"""Hydra composition shared by run.py, `lab serve`, the offline LLM API, benchmarks and tests.

lab/conf/config.yaml's defaults list starts with the `lab_knobs` node: every declared knob's
default (lab/config/knobs.py, lab/sim/knobs.py, installed plug-ins), stored by `register()`,
which also gives its `hydra.searchpath` the plug-ins' config directories (lab/config/plugins.py).
Every composition calls it first, so run.py and `LLM(...)` see the same knobs and options.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from omegaconf import DictConfig, OmegaConf, open_dict

from lab.config.knob import defaults_of
from lab.config.plugins import LAB_CONF, config_dirs, declared_knobs, knob_blocks, search_path

CONF_DIR = LAB_CONF
# config group -> the base class its options build (config group = package = base class); a
# plug-in's option subclasses it
GROUP_BASES = {
    "model": "lab.models.source.ModelSource",
    "attention": "lab.attention.base.AttentionBackend",
    "kernels": "lab.layers.ops.LayerOps",
    "quant": "lab.quant.base.QuantConfig",
    "scheduler": "lab.scheduler.queues.RequestQueue",
    "preemption": "lab.scheduler.preemption.PreemptionStrategy",
    "cache": "lab.cache.manager.KVCacheManager",
    "cache/eviction": "lab.cache.eviction.EvictionPolicy",
    "workload": "lab.workloads.base.Workload",
    "executor": "lab.executor.base.Executor",
    "logger": "lab.metrics.base.StatLogger",
    "logits_processors": "lab.logits_processors.base.LogitsProcessor",
    "speculative": "lab.speculative.base.Proposer",
    "sim/step_time": "lab.sim.step_time.base.StepTimeModel",
}
GROUPS = tuple(GROUP_BASES)
LIST_GROUPS = ("logger", "logits_processors")  # several options at once: logger=[console,jsonl]
KNOBS_NODE = "lab_knobs"  # the first entry of lab/conf/config.yaml's defaults list
SEARCH_PATH_RESOLVER = "lab_search_path"  # ${lab_search_path:} in lab/conf/config.yaml


def register() -> None:
    """Give Hydra what lab/conf/config.yaml refers to: the knobs' defaults as the `lab_knobs`
    node, and the plug-ins' search path as the `lab_search_path` resolver. Idempotent; run.py and
    every composition call it before Hydra composes."""
    ConfigStore.instance().store(name=KNOBS_NODE, node=knob_defaults())
    OmegaConf.register_new_resolver(SEARCH_PATH_RESOLVER, lambda: search_path(), replace=True)


def knob_defaults() -> dict[str, Any]:
    """Every declared knob's default as config values: top-level knobs, then blocks."""
    values: dict[str, Any] = {}
    for block, classes in knob_blocks().items():
        target = values.setdefault(block, {}) if block else values
        for cls in classes:
            target.update(defaults_of(cls))
    return values


def without_loggers_unless_given(overrides: list[str]) -> list[str]:
    """Embedded engines (LLM, lab serve) log nowhere unless a `logger=` override asks."""
    if any(o.lstrip("+~").startswith("logger=") for o in overrides):
        return list(overrides)
    return [*overrides, "logger=[]"]


def compose_config(overrides: list[str] | None = None,
                   config_path: Sequence[str | Path] = ()) -> DictConfig:
    """Compose lab/conf/config.yaml with Hydra command-line style overrides (no output dir);
    `config_path`: more config directories for this composition (see lab/config/plugins.py)."""
    return compose_with_choices(overrides, config_path)[0]


def compose_with_choices(overrides: list[str] | None = None,
                         config_path: Sequence[str | Path] = ()) -> tuple[DictConfig, dict[str, str]]:
    """compose_config, plus the option chosen in every group (as hydra_choices gives inside a
    Hydra job), for a run directory's config.yaml outside one (lab serve).

    A composition is remembered for the process, keyed by everything it reads (`config_inputs`)
    and by the overrides other than plain settings (split_settings): the same group choices
    again while no option file changed cost a copy (~3 ms) and the settings instead of
    Hydra's ~0.15 s, which every `LLM(...)`, simulator run or `lab serve` of a sweep would pay
    again. Each call gets its own copy to change."""
    overrides = list(overrides or [])
    if config_path:
        overrides.append(f"hydra.searchpath=[{','.join(search_path(config_path))}]")
    inputs = config_inputs(config_path)
    composed, settings = split_settings(overrides)
    cfg, choices = _compose_once(tuple(composed), inputs)
    cfg = copy.deepcopy(cfg)
    try:
        for override in settings:
            OmegaConf.update(cfg, override.key_or_group, override.value(), merge=True)
    except Exception:  # Hydra's own composition names what is wrong, as it would have
        cfg, choices = _compose_once(tuple(overrides), inputs)
        cfg = copy.deepcopy(cfg)
    return cfg, dict(choices)


def config_inputs(config_path: Sequence[str | Path] = ()) -> tuple:
    """What a composition reads besides its overrides: the knobs' declarations, the search
    path, and a digest of the name and text of every option file on it (so an edited, added or
    removed YAML file is read again; ~1 ms for lab's own)."""
    files = hashlib.blake2b(digest_size=16)
    for d in config_dirs(config_path):
        for p in sorted(d.rglob("*.yaml")):
            text = p.read_bytes()
            files.update(f"{p}\0{len(text)}\0".encode() + text)
    knob_classes = tuple(c for classes in knob_blocks().values() for c in classes)
    return knob_classes, tuple(search_path(config_path)), files.hexdigest()


@lru_cache(maxsize=64)
def _compose_once(overrides: tuple[str, ...], inputs: tuple) -> tuple[DictConfig, dict[str, str]]:
    """Hydra's composition of lab/conf/config.yaml (`inputs` only keys the cache)."""
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    choices = group_choices(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices


def split_settings(overrides: list[str]) -> tuple[list[str], list[Override]]:
    """(what Hydra composes, the settings to set on a copy of its result), so that compositions
    differing only in settings (`seed=1`, `workload.num_requests=8`, `sim.device=h100`: a sweep,
    a test's variations) are one remembered composition. A plain `key=value` whose key is not a
    config group is what Hydra itself sets only after composing the defaults list, by the same
    OmegaConf.update on the struct config, so the result is the same. Group choices, `+`, `++`
    and `~` edits, packages, sweeps and `hydra.*` stay Hydra's; so does anything it cannot
    parse (its error is the one to show)."""
    maybe = [o for o in overrides if "=" in o and is_setting_key(o.split("=", 1)[0])]
    if not maybe:
        return list(overrides), []
    try:
        parsed = dict(zip(maybe, OverridesParser.create().parse_overrides(maybe)))
    except Exception:
        return list(overrides), []
    settings = [o for o in maybe if _is_plain_setting(parsed[o])]
    return [o for o in overrides if o not in settings], [parsed[o] for o in settings]


def is_setting_key(key: str) -> bool:
    """A knob (`seed`), or a key inside a knob block's or a group option's node (`sim.device`,
    `workload.num_requests`); not a group (`model`, `sim/step_time`) nor `hydra.*`."""
    top = key.split(".", 1)[0]
    return "/" not in key and (key in top_level_names()
                               or ("." in key and top in GROUPS + tuple(top_level_names())))


def _is_plain_setting(override: Override) -> bool:
    """`key=value` as written: not `+`/`++`/`~`, not a sweep, no `@package`."""
    return (override.type == OverrideType.CHANGE and not override.is_sweep_override()
            and override.package is None)


def top_level_names() -> set[str]:
    """The names a top-level key may have: top-level knobs and knob blocks (slo, sim)."""
    return {k.name.split(".", 1)[0] for k in declared_knobs()}


def is_known_setting(key: str) -> bool:
    """Whether a top-level key is a config group, `hydra`, a knob or a knob block."""
    return key in GROUPS or key == "hydra" or key in top_level_names()


def nested_groups(key: str) -> set[str]:
    """The keys of a knob block that are config groups: {"step_time"} for `sim` (the group
    `sim/step_time` lives at `sim.step_time`)."""
    return {g.split("/", 1)[1] for g in GROUPS if g.startswith(f"{key}/")}


def set_knobs(cfg: DictConfig, knobs: dict[str, object]) -> DictConfig:
    """Set engine knobs (or dotted paths such as model.path) by name, refusing unknown names."""
    for key, value in knobs.items():
        if not is_known_setting(key.split(".", 1)[0]) or key in GROUPS:
            raise ValueError(unknown_setting_message(key))
        with open_dict(cfg):
            OmegaConf.update(cfg, key, value, merge=False)
    return cfg


def unknown_setting_message(key: str) -> str:
    """The refusal of a setting that is neither a config group nor an engine knob."""
    return (f"unknown setting {key!r}: config groups are {', '.join(GROUPS)}; engine knobs are "
            f"{', '.join(sorted(top_level_names()))}")


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
