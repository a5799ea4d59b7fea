"""The Llama family from its config alone (torch-free): Llama and Mistral (`attention_bias`,
`mlp_bias`), Qwen2 (q/k/v bias), Qwen3 (per-head q/k RMSNorm, `attention_bias`). The model
classes are lab/models/llama.py's; the simulator counts the same parameters from these flags.

Sliding windows per layer, as transformers applies them (`layer_attention_specs`):

    Llama        none
    Mistral      `sliding_window` on every layer when set (transformers ignores layer_types)
    Qwen2/Qwen3  the layers `layer_types` marks "sliding_attention"; without layer_types,
                 layers i >= max_window_layers when use_sliding_window (transformers' config
                 rule); the window is `sliding_window`, None unless use_sliding_window
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.attention.spec import AttentionSpec, kv_heads_per_rank
from lab.models.arch import ArchSpec, check_tp_divisible, with_windows


@dataclass(frozen=True)
class LlamaArch:
    """The per-family differences inside the Llama layout."""

    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    post_norms: bool = False  # Gemma: a norm after attention and after the MLP too (4 a layer)


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


def qwen_windows(cfg) -> list[int | None]:
    """Each layer's window under transformers' Qwen2 / Qwen3 rule (module docstring). A config
    transformers built already holds its result (`layer_types`; sliding_window None unless
    use_sliding_window); one read from elsewhere (e.g. a namespace) is derived the same way."""
    window = cfg.sliding_window if getattr(cfg, "use_sliding_window", False) else None
    types = getattr(cfg, "layer_types", None) or [
        "sliding_attention" if window is not None and i >= getattr(cfg, "max_window_layers", 0)
        else "full_attention" for i in range(cfg.num_hidden_layers)]
    return [window if kind == "sliding_attention" else None for kind in types]


class MistralSpec(LlamaSpec):
    """Mistral: the Llama layout, every layer sliding over `sliding_window` when it is set."""

    model = "lab.models.llama:MistralForCausalLM"

    @classmethod
    def layer_attention_specs(cls, hf_config, tp_size: int = 1) -> list[AttentionSpec]:
        window = getattr(hf_config, "sliding_window", None)
        return with_windows(cls.attention_spec(hf_config, tp_size),
                            [window] * hf_config.num_hidden_layers)


class Qwen2Spec(LlamaSpec):
    """Qwen2: bias on q/k/v (not on o_proj); sliding windows by `qwen_windows`."""

    model = "lab.models.llama:Qwen2ForCausalLM"

    @classmethod
    def arch(cls, cfg) -> LlamaArch:
        return LlamaArch(qkv_bias=True)

    @classmethod
    def layer_attention_specs(cls, hf_config, tp_size: int = 1) -> list[AttentionSpec]:
        return with_windows(cls.attention_spec(hf_config, tp_size), qwen_windows(hf_config))


class Qwen3Spec(LlamaSpec):
    """Qwen3: per-head RMSNorm on q and k before RoPE; `attention_bias` on q/k/v/o; sliding
    windows by `qwen_windows`."""

    model = "lab.models.llama:Qwen3ForCausalLM"

    @classmethod
    def arch(cls, cfg) -> LlamaArch:
        bias = bool(getattr(cfg, "attention_bias", False))
        return LlamaArch(bias, bias, False, qk_norm=True)

    @classmethod
    def layer_attention_specs(cls, hf_config, tp_size: int = 1) -> list[AttentionSpec]:
        return with_windows(cls.attention_spec(hf_config, tp_size), qwen_windows(hf_config))
