"""The Llama family from its config alone (torch-free): Llama and Mistral (`attention_bias`,
`mlp_bias`), Qwen2 (q/k/v bias), Qwen3 (per-head q/k RMSNorm, `attention_bias`). The model
classes are lab/models/llama.py's; the simulator counts the same parameters from these flags.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.attention.spec import AttentionSpec, kv_heads_per_rank
from lab.models.arch import ArchSpec, check_tp_divisible


@dataclass(frozen=True)
class LlamaArch:
    """The per-family differences inside the Llama layout."""

    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False


def head_dim_of(cfg) -> int:
    """Explicit `head_dim` when the config has one, else hidden_size // num_attention_heads."""
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


class LlamaSpec(ArchSpec):
    """Llama: `attention_bias` on q/k/v/o, `mlp_bias` on the MLP."""

    model = "lab.models.llama:LlamaForCausalLM"

    @classmethod
    def arch(cls, cfg) -> LlamaArch:
        """The family's flags of this config."""
        bias = bool(getattr(cfg, "attention_bias", False))
        return LlamaArch(bias, bias, bool(getattr(cfg, "mlp_bias", False)))

    @classmethod
    def attention_spec(cls, hf_config, tp_size: int = 1) -> AttentionSpec:
        """This rank's heads: num_attention_heads / tp; kv heads / tp, or 1 when tp exceeds
        them (replicated)."""
        cfg = hf_config
        check_tp_divisible(cfg, tp_size, ("num_attention_heads",))
        kv_heads, _ = kv_heads_per_rank(cfg.num_key_value_heads, tp_size)
        return AttentionSpec(
            cfg.num_attention_heads // tp_size, kv_heads, head_dim_of(cfg), kind="gqa"
        )


class MistralSpec(LlamaSpec):
    """Mistral: the Llama layout."""

    model = "lab.models.llama:MistralForCausalLM"


class Qwen2Spec(LlamaSpec):
    """Qwen2: bias on q/k/v (not on o_proj)."""

    model = "lab.models.llama:Qwen2ForCausalLM"

    @classmethod
    def arch(cls, cfg) -> LlamaArch:
        return LlamaArch(qkv_bias=True)


class Qwen3Spec(LlamaSpec):
    """Qwen3: per-head RMSNorm on q and k before RoPE; `attention_bias` on q/k/v/o."""

    model = "lab.models.llama:Qwen3ForCausalLM"

    @classmethod
    def arch(cls, cfg) -> LlamaArch:
        bias = bool(getattr(cfg, "attention_bias", False))
        return LlamaArch(bias, bias, False, qk_norm=True)
