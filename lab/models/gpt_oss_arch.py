"""gpt-oss from the config alone (torch-free): the Llama layout's heads with attention biases,
sliding / full layers by `layer_types` (transformers' default alternates from a sliding layer
0), a learned sink logit per head on every layer, and MoE on every layer (router with a bias,
experts with biases). The model class is lab/models/gpt_oss.py's; the simulator counts the same
parameters from these answers.

Only dense checkpoints load (bf16 / fp32 in transformers' layout): the released checkpoints
store their experts in MXFP4 (`quantization_config.quant_method: mxfp4`), which lab refuses by
name (`attention_spec`, the first question the loader and the simulator ask).
"""

from __future__ import annotations

from lab.attention.spec import AttentionSpec
from lab.models.arch import (
    check_tp_divisible,
    layer_type_windows,
    pattern_layer_types,
    with_windows,
)
from lab.models.llama_arch import LlamaArch, LlamaSpec


def quant_method(cfg) -> str | None:
    """The checkpoint's `quantization_config.quant_method` (None: a dense checkpoint)."""
    quant = getattr(cfg, "quantization_config", None)
    if quant is not None and not isinstance(quant, dict):
        quant = quant.to_dict()
    return (quant or {}).get("quant_method")


def check_moe_tp(cfg, tp_size: int, expert_parallel: bool) -> None:
    """ValueError naming the field `tp_size` does not divide: each expert's width
    (intermediate_size), or with expert_parallel the experts (num_local_experts)."""
    field = "num_local_experts" if expert_parallel and tp_size > 1 else "intermediate_size"
    check_tp_divisible(cfg, tp_size, (field,))


class GptOssSpec(LlamaSpec):
    """gpt-oss: biased q/k/v/o, sinks, sliding / full layers, MoE everywhere."""

    model = "lab.models.gpt_oss:GptOssForCausalLM"

    @classmethod
    def arch(cls, cfg) -> LlamaArch:
        bias = bool(getattr(cfg, "attention_bias", True))
        return LlamaArch(bias, bias)

    @classmethod
    def attention_spec(cls, hf_config, tp_size: int = 1) -> AttentionSpec:
        """The Llama layout's; ValueError for an MXFP4 checkpoint (module docstring)."""
        method = quant_method(hf_config)
        if method is not None:
            raise ValueError(
                f"gpt-oss checkpoints quantized with quantization_config.quant_method={method!r} "
                "are not supported (the released MXFP4 experts among them): lab loads gpt-oss's "
                "dense weights only (bf16 / fp32 in transformers' layout, e.g. a checkpoint "
                "transformers dequantized with Mxfp4Config(dequantize=True) and saved)")
        return super().attention_spec(hf_config, tp_size)

    @classmethod
    def layer_attention_specs(cls, hf_config, tp_size: int = 1) -> list[AttentionSpec]:
        windows = layer_type_windows(hf_config, pattern_layer_types(hf_config, 2))
        return with_windows(cls.attention_spec(hf_config, tp_size), windows, sinks=True)

    @classmethod
    def router_params(cls, cfg) -> int:
        """Parameters of one layer's router: weight [E, hidden] and bias [E]."""
        return cfg.num_local_experts * (cfg.hidden_size + 1)
