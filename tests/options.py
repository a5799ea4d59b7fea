"""The options of the Hydra config groups, read from conf/<group>/*.yaml, so that a new plug-in is
tested by every test that loops over its group without editing the test.

    options("scheduler")      -> ["fair", "fcfs", "priority", "sjf"]
    tiny_models("mla")        -> the embedded MLA presets (tiny_deepseek, ...)

Exclusions are explicit (see `tiny_models`); a test that needs a further one says why beside it.
"""

from __future__ import annotations

from pathlib import Path

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def options(group: str) -> list[str]:
    """The option names of a config group, sorted (the stems of conf/<group>/*.yaml)."""
    names = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
    if not names:
        raise ValueError(f"no options in {CONF_DIR / group}")
    return names


def target(group: str, option: str) -> str:
    """The `_target_` of an option (the class or factory it instantiates)."""
    from omegaconf import OmegaConf

    return OmegaConf.load(CONF_DIR / group / f"{option}.yaml")["_target_"]


def build(group: str, option: str, **knobs):
    """Instantiate a self-contained option (no Hydra defaults list) from its yaml, with `knobs`
    overriding its fields: what `python run.py group=option group.knob=...` builds."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    return instantiate(OmegaConf.merge(OmegaConf.load(CONF_DIR / group / f"{option}.yaml"), knobs))


def tiny_models(kind: str | None = None) -> list[str]:
    """The `model` options that are embedded tiny presets: `tiny_*`. Left out: `hf` (needs
    model.path) and `bench_*` (benchmark widths: minutes per run in fp32 on a CPU, bf16 by
    default). kind: None (all), "mla" (kv_lora_rank: DeepSeek MLA) or "gqa" (the others)."""
    from lab.models.tiny import preset

    names = [m for m in options("model") if m.startswith("tiny_")]
    if kind is None:
        return names
    if kind not in ("mla", "gqa"):
        raise ValueError(f"kind={kind!r}: expected 'mla', 'gqa' or None")
    return [m for m in names if ("kv_lora_rank" in preset(m)) == (kind == "mla")]
