"""Gemma-2 and Gemma-3 (text) from the config alone (torch-free): the Llama layout's heads and
flags, plus which layers are local (sliding window) or global and Gemma-2's attention soft cap.
The model classes are lab/models/gemma.py's; the simulator counts the same parameters from these
flags (`post_norms`: four norms a layer; Gemma-3's `qk_norm`).

Layer i is local iff `layer_types[i]` is "sliding_attention" (transformers fills layer_types
from its pattern when a config has none: Gemma-2 alternates local / global from layer 0,
Gemma-3 makes every `sliding_window_pattern`-th layer (default 6) global):

    Gemma-2   local layers slide over `sliding_window`; every layer soft-caps its scores at
              `attn_logit_softcapping` (scores -> cap * tanh(scores / cap))
    Gemma-3   local layers slide over `sliding_window`; no soft cap (transformers' Gemma-3
              does not apply attn_logit_softcapping, so neither does lab)
"""

from __future__ import annotations

from lab.attention.spec import AttentionSpec
from lab.models.arch import layer_type_windows, pattern_layer_types, with_windows
from lab.models.llama_arch import LlamaArch, LlamaSpec


class Gemma2Spec(LlamaSpec):
    """Gemma-2: local / global layers, attention soft cap, four norms a layer, GELU MLP."""

    model = "lab.models.gemma:Gemma2ForCausalLM"
    qk_norm = False  # per-head q / k norms (Gemma-3)

    @classmethod
    def arch(cls, cfg) -> LlamaArch:
        bias = bool(getattr(cfg, "attention_bias", False))
        return LlamaArch(bias, bias, False, qk_norm=cls.qk_norm, post_norms=True)

    @classmethod
    def layer_types(cls, cfg) -> list[str]:
        return pattern_layer_types(cfg, 2)

    @classmethod
    def attn_softcap(cls, cfg) -> float | None:
        """The score soft cap every layer applies (None: none)."""
        return getattr(cfg, "attn_logit_softcapping", None)

    @classmethod
    def attention_spec(cls, hf_config, tp_size: int = 1) -> AttentionSpec:
        """The Llama layout's (this rank's heads, kv heads split or replicated); ValueError for
        a bidirectional config (`use_bidirectional_attention`: an encoder use, not causal LM)."""
        if getattr(hf_config, "use_bidirectional_attention", False):
            raise ValueError("use_bidirectional_attention=True is not supported (lab runs causal "
                             "language models)")
        return super().attention_spec(hf_config, tp_size)

    @classmethod
    def layer_attention_specs(cls, hf_config, tp_size: int = 1) -> list[AttentionSpec]:
        windows = layer_type_windows(hf_config, cls.layer_types(hf_config))
        return with_windows(cls.attention_spec(hf_config, tp_size), windows,
                            logit_softcap=cls.attn_softcap(hf_config))


class Gemma3Spec(Gemma2Spec):
    """Gemma-3 (text, `gemma3_text`): Gemma-2's layout with per-head q/k norms, every
    `sliding_window_pattern`-th layer global, separate RoPE for local and global layers, no
    attention soft cap."""

    model = "lab.models.gemma:Gemma3ForCausalLM"
    qk_norm = True

    @classmethod
    def layer_types(cls, cfg) -> list[str]:
        pattern = (getattr(cfg, "sliding_window_pattern", None)
                   or getattr(cfg, "_sliding_window_pattern", None) or 6)  # transformers keeps it private
        return pattern_layer_types(cfg, pattern)

    @classmethod
    def attn_softcap(cls, cfg) -> float | None:
        return None  # transformers' Gemma3Attention does not pass attn_logit_softcapping
