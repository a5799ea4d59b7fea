"""The one lookup table of the project: HF `architectures` name -> model class, through the
architecture's light spec.

The table maps each name to its `ArchSpec` (lab/models/arch.py: torch-free, config-only), which
names its model class by import path. `arch_spec(hf_config)` answers what a config is without
importing any model code (what the simulator sizes a model from); `model_class(hf_config)`
imports the class that runs it (what the loader builds).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lab.models.arch import ArchSpec
from lab.models.deepseek_arch import DeepseekV2Spec, DeepseekV3Spec
from lab.models.gemma_arch import Gemma2Spec, Gemma3Spec
from lab.models.gpt_oss_arch import GptOssSpec
from lab.models.llama_arch import LlamaSpec, MistralSpec, Qwen2Spec, Qwen3Spec

if TYPE_CHECKING:
    from lab.models.base import CausalLM

ARCHITECTURES: dict[str, type[ArchSpec]] = {
    "DeepseekV2ForCausalLM": DeepseekV2Spec,
    "DeepseekV3ForCausalLM": DeepseekV3Spec,
    "Gemma2ForCausalLM": Gemma2Spec,
    "Gemma3ForCausalLM": Gemma3Spec,
    "GptOssForCausalLM": GptOssSpec,
    "LlamaForCausalLM": LlamaSpec,
    "MistralForCausalLM": MistralSpec,
    "Qwen2ForCausalLM": Qwen2Spec,
    "Qwen3ForCausalLM": Qwen3Spec,
}


def arch_spec(hf_config) -> type[ArchSpec]:
    """The spec of the first of the config's `architectures` that is supported; ValueError
    naming the supported ones when none is."""
    archs = list(getattr(hf_config, "architectures", None) or [])
    for arch in archs:
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    raise ValueError(
        f"unsupported architecture {archs or None} (supported: {', '.join(sorted(ARCHITECTURES))})"
    )


def model_class(hf_config) -> type[CausalLM]:
    """The model class of the config's architecture (imported now: torch and the layers)."""
    return arch_spec(hf_config).model_class()
