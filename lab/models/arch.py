"""What lab knows of an architecture from its Hugging Face config alone: the light half of a model
family, without torch, shared by the model classes and the simulator.

An `ArchSpec` subclass per HF `architectures` name (the one lookup table maps the name to it:
lab/models/registry.py) answers the config-only questions — the AttentionSpec of one of `tp_size`
ranks (and of each layer: `layer_attention_specs`, its sliding window, sinks and soft cap), and
the family's flags (lab/models/llama_arch.py, gemma_arch.py, gpt_oss_arch.py, deepseek_arch.py)
— and names the model class that runs it by import path, so that asking the questions imports
no model code. The model class holds its spec (`CausalLM.arch_spec`) and builds its layers from
the same answers. The helpers below read transformers' per-layer `layer_types`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace
from importlib import import_module
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from lab.attention.spec import AttentionSpec
    from lab.models.base import CausalLM


class ArchSpec(ABC):
    """An architecture's config-only knowledge (classmethods over an HF config; never built)."""

    #: the model class that runs this architecture, "module:Class"; imported by `model_class()`
    model: ClassVar[str]

    @classmethod
    def model_class(cls) -> type[CausalLM]:
        """The model class named by `model`, imported now (torch and the layers with it)."""
        module, _, name = cls.model.partition(":")
        return getattr(import_module(module), name)

    @classmethod
    @abstractmethod
    def attention_spec(cls, hf_config, tp_size: int = 1) -> AttentionSpec:
        """The AttentionSpec of one of `tp_size` tensor-parallel ranks of a model with this HF
        config (no weights, no layers); ValueError naming the config field that does not
        divide."""


    @classmethod
    def layer_attention_specs(cls, hf_config, tp_size: int = 1) -> list[AttentionSpec]:
        """Each decoder layer's AttentionSpec on one of `tp_size` ranks: what a layer asks of
        attention (its sliding window, sinks, soft cap) and what groups its KV cache
        (lab/cache/groups.py). Default: `attention_spec` for every one of num_hidden_layers;
        a family with per-layer attention (Gemma, gpt-oss, Qwen2's layer_types) overrides it,
        keeping one KV layout (heads, head_dim) for every layer."""
        return [cls.attention_spec(hf_config, tp_size)] * hf_config.num_hidden_layers


def pattern_layer_types(hf_config, full_every: int) -> list[str]:
    """The config's `layer_types`, or the default transformers fills them with for Gemma and
    gpt-oss: layer i "full_attention" when (i + 1) % full_every == 0, else "sliding_attention"."""
    return getattr(hf_config, "layer_types", None) or [
        "sliding_attention" if (i + 1) % full_every else "full_attention"
        for i in range(hf_config.num_hidden_layers)]


def layer_type_windows(hf_config, layer_types: list[str]) -> list[int | None]:
    """Each layer's sliding window as transformers reads `layer_types`: the config's
    `sliding_window` for a "sliding_attention" layer, None (full attention) for any other and
    when the config has no window."""
    window = getattr(hf_config, "sliding_window", None)
    return [window if kind == "sliding_attention" else None for kind in layer_types]


def with_windows(spec: AttentionSpec, windows: list[int | None], **features) -> list[AttentionSpec]:
    """One spec per layer: `spec` with that layer's sliding window (and `features`, the
    AttentionSpec fields every layer shares, e.g. sinks=True)."""
    return [replace(spec, sliding_window=window, **features) for window in windows]


def check_tp_divisible(hf_config, tp_size: int, fields: tuple[str, ...]) -> None:
    """ValueError naming the first config field in `fields` (absent or None ones are skipped)
    that `tp_size` does not divide."""
    for field in fields:
        value = getattr(hf_config, field, None)
        if value is not None and value % tp_size:
            raise ValueError(f"{field}={value} is not divisible by tensor_parallel_size={tp_size}")
