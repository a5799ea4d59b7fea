"""The one lookup table of the project: HF `architectures` name -> model class.

Everything that turns a checkpoint's config into a model class (the loader, a simulator sizing
the KV cache from a config-only checkpoint) asks `model_class(hf_config)`.
"""

from __future__ import annotations

from lab.models.base import CausalLM
from lab.models.deepseek import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
from lab.models.llama import (
    LlamaForCausalLM,
    MistralForCausalLM,
    Qwen2ForCausalLM,
    Qwen3ForCausalLM,
)

ARCHITECTURES: dict[str, type[CausalLM]] = {
    "DeepseekV2ForCausalLM": DeepseekV2ForCausalLM,
    "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def model_class(hf_config) -> type[CausalLM]:
    """The model class of the first of the config's `architectures` that is supported;
    ValueError naming the supported ones when none is."""
    archs = list(getattr(hf_config, "architectures", None) or [])
    for arch in archs:
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    raise ValueError(
        f"unsupported architecture {archs or None} (supported: {', '.join(sorted(ARCHITECTURES))})"
    )
