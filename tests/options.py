"""The options of the Hydra config groups — lab's (lab/conf/<group>/*.yaml) and every installed
plug-in's — so that a new plug-in is tested by every test that loops over its group without
editing the test.

    options("scheduler")      -> ["fair", "fcfs", "priority", "sjf"]
    tiny_models("mla")        -> the embedded MLA presets (tiny_deepseek, ...)
    tiny_models("hybrid")     -> the presets whose layers use attention features (windows, ...)

Exclusions are explicit (see `tiny_models`); a test that needs a further one says why beside it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from lab.config.plugins import group_options, option_file


def options(group: str) -> list[str]:
    """The option names of a config group, sorted (lab's and installed plug-ins')."""
    names = group_options(group)
    if not names:
        raise ValueError(f"no options in config group {group!r}")
    return names


def backends() -> list[str]:
    """The `attention` options that name one backend class: all but `auto`, which chooses one of
    them by device and model (lab/attention/auto.py; tests/attention/test_auto.py)."""
    return [o for o in options("attention") if o != "auto"]


def option_yaml(group: str, option: str):
    """An option's YAML, loaded (where Hydra finds it first), as a node under a root holding
    every knob's default, so that its `${knob}` interpolations resolve as in a composed config."""
    from omegaconf import OmegaConf

    from lab.config.compose import knob_defaults

    path = option_file(group, option)
    if path is None:
        raise ValueError(f"no option {option!r} in config group {group!r}")
    root = OmegaConf.create({**knob_defaults(), "option": OmegaConf.load(Path(path))})
    return root.option


def target(group: str, option: str) -> str:
    """The `_target_` of an option (the class or factory it instantiates)."""
    return option_yaml(group, option)["_target_"]


def build(group: str, option: str, **knobs):
    """Instantiate a self-contained option (no Hydra defaults list) from its yaml, with `knobs`
    overriding its fields: what `python run.py group=option group.knob=...` builds."""
    from hydra.utils import instantiate

    node = option_yaml(group, option)
    node.merge_with(knobs)
    return instantiate(node)


def attention_kinds(option: str) -> tuple[str, ...]:
    """The attention kinds ("mha", "gqa", "mla") an `attention` option's backend supports."""
    from hydra.utils import get_class

    return get_class(target("attention", option)).supported_kinds


def model_for(attention: str) -> str:
    """The first tiny preset whose attention kind the `attention` option supports (a "hybrid"
    preset is never the one: it is not a kind of attention a backend names)."""
    kinds = attention_kinds(attention)
    return next(m for m in tiny_models() if model_kind(m) in kinds)


@cache
def model_kind(name: str) -> str:
    """A tiny preset's attention kind: "mla" (DeepSeek, kv_lora_rank), "hybrid" (GQA whose
    layers use ATTENTION_FEATURES: sliding windows, sinks, soft caps; lab/attention/spec.py) or
    "gqa" (every layer plain causal attention)."""
    from lab.models.tiny import preset

    spec = preset(name)
    if "kv_lora_rank" in spec:
        return "mla"
    return "hybrid" if model_features(name) else "gqa"


@cache
def model_features(name: str) -> frozenset[str]:
    """The attention features a tiny preset's layers use, from its HF config alone (its
    architecture's `layer_attention_specs`)."""
    from lab.models.registry import arch_spec
    from lab.models.tiny import hf_config, preset

    cfg = hf_config(preset(name))
    return frozenset().union(*(s.features for s in arch_spec(cfg).layer_attention_specs(cfg)))


# tiny_deepseek_mtp is tiny_deepseek_v3 tensor for tensor plus its MTP layers: every test of a
# target would run the same model twice (the engine parity alone ~45 s of CPU). Its own tests:
# tests/models/test_deepseek_mtp.py (the target loads; the MTP layers against transformers).
DRAFT_PRESETS = ("tiny_deepseek_mtp",)


def tiny_models(kind: str | None = None) -> list[str]:
    """The `model` options that are embedded tiny presets: `tiny_*`. Left out: `hf` (needs
    model.path), `bench_*` (benchmark widths: minutes per run in fp32 on a CPU, bf16 by
    default) and DRAFT_PRESETS (a target another preset already is). kind: None (all), "mla" (kv_lora_rank: DeepSeek MLA), "hybrid" (layers with
    attention features: Mistral's and Qwen2's windows, Gemma, gpt-oss) or "gqa" (the others:
    plain causal attention, what every attention backend runs)."""
    names = [m for m in options("model") if m.startswith("tiny_") and m not in DRAFT_PRESETS]
    if kind not in (None, "mla", "gqa", "hybrid"):
        raise ValueError(f"kind={kind!r}: expected 'mla', 'gqa', 'hybrid' or None")
    return [m for m in names if kind is None or model_kind(m) == kind]
