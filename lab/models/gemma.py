"""Gemma-2 and Gemma-3 (text): the Llama layout with Gemma's differences, as transformers runs them.

Which layers are local (sliding window) or global, and Gemma-2's attention soft cap, are
lab/models/gemma_arch.py's (each layer's AttentionSpec); everything else follows the Llama
classes of lab/models/llama.py (fused q/k/v and gate/up, TP splits, the strict loader):

    embedding    scaled by sqrt(hidden_size), the factor rounded to the model dtype first
    norms        GemmaRMSNorm: weight stored as the offset from 1, applied in float32; four a
                 layer, the attention's and the MLP's outputs normed before the residual add:
                     h = h + post_attention_norm(attn(input_norm(h)))
                     h = h + post_feedforward_norm(mlp(pre_feedforward_norm(h)))
    attention    softmax scale query_pre_attn_scalar^-0.5; Gemma-3: per-head q/k GemmaRMSNorm
                 before RoPE, and a RoPE per layer type (local layers their own base,
                 rope_parameters["sliding_attention"]; global layers the scaled one)
    MLP          down(gelu_tanh(gate) * up) (`hidden_activation`: gelu_pytorch_tanh)
    logits       soft-capped at final_logit_softcapping when set (cap * tanh(logits / cap));
                 the LM head is tied to the embedding

The residual add rides in the next norm (GemmaRMSNorm's fused add, as RMSNorm's), so the stack
is lab/layers/decoder.py's DecoderStack: a layer returns post_feedforward_norm(mlp) and the
residual stream before it. The final soft cap is applied to the float32 logits (transformers
applies it in the model dtype: the same in float32, one rounding apart in bf16).
"""

from __future__ import annotations

import torch
from torch import nn

from lab.attention.base import AttentionBackend
from lab.attention.spec import AttentionSpec
from lab.distributed.parallel_state import GroupCoordinator
from lab.layers.activation import GATED_ACTS
from lab.layers.decoder import DecoderStack, GatedMLP, PreNormDecoderLayer
from lab.layers.embedding import VocabParallelEmbedding
from lab.layers.norm import GemmaRMSNorm
from lab.layers.ops import LayerOps
from lab.layers.rotary import RotaryEmbedding
from lab.models.gemma_arch import Gemma2Spec, Gemma3Spec
from lab.models.llama import LlamaAttention, LlamaForCausalLM
from lab.models.llama_arch import LlamaArch, head_dim_of


def check_gelu(cfg) -> str:
    """Gemma's `hidden_activation`, refused unless a gated MLP implements it."""
    act = getattr(cfg, "hidden_activation", None) or "gelu_pytorch_tanh"
    if act not in GATED_ACTS:
        raise ValueError(f"hidden_activation={act!r} is not supported "
                         f"(supported: {', '.join(GATED_ACTS)})")
    return act


class ScaledEmbedding(VocabParallelEmbedding):
    """The token embedding times `scale` (sqrt(hidden_size)), the factor cast to the
    embedding's dtype before the product, as transformers' Gemma embedding does."""

    def __init__(self, num_embeddings: int, embedding_dim: int, scale: float,
                 tp: GroupCoordinator | None = None):
        super().__init__(num_embeddings, embedding_dim, tp=tp)
        self.scale = scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out = super().forward(input_ids)
        return out * torch.tensor(self.scale, dtype=out.dtype, device=out.device)


class GemmaAttention(LlamaAttention):
    """LlamaAttention with Gemma's softmax scale and GemmaRMSNorm q/k norms (Gemma-3)."""

    def softmax_scale(self, cfg) -> float:
        return cfg.query_pre_attn_scalar**-0.5

    def head_norm(self, cfg, ops: LayerOps) -> nn.Module:
        return GemmaRMSNorm(self.head_dim, cfg.rms_norm_eps)


class GemmaDecoderLayer(PreNormDecoderLayer):
    """Attention and GELU MLP, each between a pre-norm and a post-norm (module docstring)."""

    def __init__(self, cfg, arch: LlamaArch, layer_idx: int, spec: AttentionSpec,
                 backend: AttentionBackend, rotary_emb: RotaryEmbedding, ops: LayerOps,
                 tp: GroupCoordinator):
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = GemmaAttention(cfg, arch, layer_idx, spec, backend, rotary_emb, ops, tp)
        self.mlp = GatedMLP(h, cfg.intermediate_size, ops, False, tp, act=check_gelu(cfg))
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def forward(self, h, residual, positions, kv_cache, metadata):
        if residual is None:
            h, residual = self.input_layernorm(h), h
        else:
            h, residual = self.input_layernorm(h, residual)
        h = self.post_attention_layernorm(self.self_attn(h, positions, kv_cache, metadata))
        h, residual = self.pre_feedforward_layernorm(h, residual)
        return self.post_feedforward_layernorm(self.mlp(h)), residual


class GemmaModel(DecoderStack):
    """Scaled embedding, decoder layers, final norm (HF's `model.` prefix). One RoPE per layer
    type (`layer_types`: each layer's) when the config's rope_parameters are per layer type
    (Gemma-3), else one for every layer (Gemma-2)."""

    def __init__(self, cfg, arch: LlamaArch, layer_specs: list[AttentionSpec],
                 layer_types: list[str], backend: AttentionBackend, ops: LayerOps,
                 tp: GroupCoordinator):
        super().__init__()
        self.embed_tokens = ScaledEmbedding(cfg.vocab_size, cfg.hidden_size,
                                            cfg.hidden_size**0.5, tp=tp)
        head_dim = head_dim_of(cfg)
        rope = getattr(cfg, "rope_parameters", None) or {}
        per_type = "full_attention" in rope  # Gemma-3: {layer type: its rope parameters}
        self.rotary_embs = nn.ModuleDict({
            kind: RotaryEmbedding.from_hf_config(cfg, head_dim, ops, kind if per_type else None)
            for kind in sorted(set(layer_types))})
        self.layers = nn.ModuleList(
            GemmaDecoderLayer(cfg, arch, i, spec, backend, self.rotary_embs[kind], ops, tp)
            for i, (spec, kind) in enumerate(zip(layer_specs, layer_types, strict=True)))
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Gemma2ForCausalLM(LlamaForCausalLM):
    """Gemma-2: local / global layers, attention and final logit soft caps."""

    arch_spec = Gemma2Spec

    def build_stack(self, cfg, attn_backend: AttentionBackend) -> nn.Module:
        return GemmaModel(cfg, self.arch_spec.arch(cfg), self.layer_specs,
                          self.arch_spec.layer_types(cfg), attn_backend, self.ops, self.tp)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """As LlamaForCausalLM's, soft-capped at final_logit_softcapping when set."""
        logits = self.lm_head(hidden)
        cap = getattr(self.config, "final_logit_softcapping", None)
        if logits is None or cap is None:
            return logits
        return cap * torch.tanh(logits / cap)


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """Gemma-3 (text): q/k norms, a global layer every sliding_window_pattern-th, local and
    global RoPE, no attention soft cap."""

    arch_spec = Gemma3Spec
