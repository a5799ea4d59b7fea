"""The Llama family: Llama, Mistral, Qwen2 (q/k/v bias), Qwen3 (per-head q/k RMSNorm).

What each family is from its config alone (flags, attention spec) is lab/models/llama_arch.py's.
One flat token batch per step (requests back to back, see lab/attention/base.py); attention is
delegated to the engine's AttentionBackend with explicit per-step metadata (no globals).
RMSNorm, RoPE and SiLU·mul run through the `LayerOps` given to the model (PyTorch or Triton);
one RotaryEmbedding (cos/sin tables) is shared by every attention layer. Each attention layer
passes the backend the features of its own spec (`CausalLM.layer_specs`): Mistral's and
Qwen2/Qwen3's sliding windows (which layers slide: lab/models/llama_arch.py).
Weights are stored fused: qkv_proj = | q | k | v |, gate_up_proj = | gate | up |. The decoder
layer and stack forwards (pre-norm, residual carried) are lab/layers/decoder.py's.

Tensor parallel over `tp` (lab/layers/linear.py): qkv_proj splits the heads (kv heads
replicated when tp > num_key_value_heads), o_proj is row-parallel; gate_up column-parallel,
down_proj row-parallel; embedding and LM head vocab-parallel. Each rank attends over its own
heads with its own KV cache.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from lab.attention.base import AttentionBackend
from lab.attention.spec import AttentionSpec
from lab.distributed.parallel_state import GroupCoordinator
from lab.layers.decoder import DecoderStack, GatedMLP, PreNormDecoderLayer, check_silu
from lab.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from lab.layers.linear import (
    QKVParallelLinear,
    RowParallelLinear,
    default_weight_loader,
)
from lab.layers.norm import RMSNorm
from lab.layers.ops import LayerOps
from lab.layers.rotary import RotaryEmbedding
from lab.models.arch import check_tp_divisible
from lab.models.base import CausalLM
from lab.models.llama_arch import (
    LlamaArch,
    LlamaSpec,
    MistralSpec,
    Qwen2Spec,
    Qwen3Spec,
    head_dim_of,
)
from lab.models.weight_utils import StackedMapping, WeightCheck

STACKED = StackedMapping(
    (
        ("qkv_proj", "q_proj", "q"),
        ("qkv_proj", "k_proj", "k"),
        ("qkv_proj", "v_proj", "v"),
        ("gate_up_proj", "gate_proj", 0),
        ("gate_up_proj", "up_proj", 1),
    )
)
SKIPPED = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


class LlamaAttention(nn.Module):
    """Fused qkv projection, optional per-head q/k norm, RoPE, backend attention with the
    layer's features (`spec`: its sliding window), o_proj (this rank's heads; o_proj
    all-reduces)."""

    def __init__(
        self, cfg, arch: LlamaArch, layer_idx: int, spec: AttentionSpec, backend: AttentionBackend,
        rotary_emb: RotaryEmbedding, ops: LayerOps, tp: GroupCoordinator,
    ):
        super().__init__()
        self.layer_idx = layer_idx
        self.attn_kwargs = spec.forward_kwargs()
        self.rotary_emb = rotary_emb  # shared with the model and the other layers
        self.backend = backend
        self.head_dim = head_dim_of(cfg)
        self.scale = self.softmax_scale(cfg)
        heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, self.head_dim, heads, kv_heads,
                                          arch.qkv_bias, tp=tp)
        self.o_proj = RowParallelLinear(heads * self.head_dim, cfg.hidden_size, arch.o_bias, tp=tp)
        if arch.qk_norm:
            self.q_norm = self.head_norm(cfg, ops)
            self.k_norm = self.head_norm(cfg, ops)
        self.qk_norm = arch.qk_norm

    def softmax_scale(self, cfg) -> float:
        """head_dim^-0.5 (RoPE's attention scaling is already inside cos/sin)."""
        return self.head_dim**-0.5

    def head_norm(self, cfg, ops: LayerOps) -> nn.Module:
        """The per-head norm of q or k (Qwen3: RMSNorm over head_dim)."""
        return RMSNorm(self.head_dim, cfg.rms_norm_eps, ops=ops)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, kv_cache, metadata) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(h))
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary_emb(positions, q, k)
        out = self.attend(q, k, v, kv_cache, metadata)
        return self.o_proj(out.reshape(out.shape[0], -1))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache,
               metadata) -> torch.Tensor:
        """The backend's attention over this layer's KV cache, with the layer's features."""
        return self.backend.forward(self.layer_idx, q, k, v, kv_cache, metadata, self.scale,
                                    **self.attn_kwargs)


class LlamaDecoderLayer(PreNormDecoderLayer):
    """Pre-norm attention + MLP block carrying the residual stream separately."""

    def __init__(
        self, cfg, arch: LlamaArch, layer_idx: int, spec: AttentionSpec, backend: AttentionBackend,
        rotary_emb: RotaryEmbedding, ops: LayerOps, tp: GroupCoordinator,
    ):
        super().__init__()
        self.self_attn = LlamaAttention(cfg, arch, layer_idx, spec, backend, rotary_emb, ops, tp)
        check_silu(cfg)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, ops, arch.mlp_bias, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops=ops)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops=ops)



class LlamaModel(DecoderStack):
    """Embedding, decoder layers, final norm (HF's `model.` prefix); `layer_specs`: each
    layer's attention spec."""

    def __init__(self, cfg, arch: LlamaArch, layer_specs: list[AttentionSpec],
                 backend: AttentionBackend, ops: LayerOps, tp: GroupCoordinator):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp=tp)
        self.rotary_emb = RotaryEmbedding.from_hf_config(cfg, head_dim_of(cfg), ops=ops)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(cfg, arch, i, spec, backend, self.rotary_emb, ops, tp)
            for i, spec in enumerate(layer_specs)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops=ops)



class LlamaForCausalLM(CausalLM):
    """A Llama-layout causal LM run on a flat token batch with paged attention: embedding,
    decoder layers and final norm (HF's `model.`, `build_stack`), the LM head. Families of the
    same checkpoint layout (fused q/k/v and gate/up at load) subclass it with their own stack
    (lab/models/gemma.py, gpt_oss.py)."""

    arch_spec = LlamaSpec

    def __init__(
        self, hf_config, attn_backend: AttentionBackend, ops: LayerOps | None = None,
        tp: GroupCoordinator | None = None, expert_parallel: bool = False,
    ):
        super().__init__(hf_config, attn_backend, ops, tp, expert_parallel)
        cfg = hf_config
        self.check_tp(cfg, self.tp.world_size, expert_parallel)
        self.tie_word_embeddings = bool(getattr(cfg, "tie_word_embeddings", False))
        self.model = self.build_stack(cfg, attn_backend)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tp=self.tp)
        if self.tie_word_embeddings:
            self.lm_head.tie(self.model.embed_tokens)

    def build_stack(self, cfg, attn_backend: AttentionBackend) -> nn.Module:
        """The `model.` module: embedding, decoder layers (each with its `layer_specs` entry),
        final norm."""
        return LlamaModel(cfg, self.arch_spec.arch(cfg), self.layer_specs, attn_backend,
                          self.ops, self.tp)

    @classmethod
    def check_tp(cls, cfg, tp_size: int, expert_parallel: bool) -> None:
        """ValueError naming a config field `tp_size` does not divide (the MLP's width)."""
        check_tp_divisible(cfg, tp_size, ("intermediate_size",))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: object,
    ) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        return self.model(input_ids, positions, kv_caches, attn_metadata)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Hidden [N, hidden] -> float32 logits [N, vocab] on the TP group's rank 0 (None on
        the others; every rank calls it)."""
        return self.lm_head(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named tensors (fusing q/k/v and gate/up); strict: raises ValueError naming every
        missing, unexpected and mis-shaped tensor. Returns the names of the parameters loaded."""
        params = dict(self.named_parameters())
        check = WeightCheck()
        for name, tensor in weights:
            if name.endswith(SKIPPED) or (self.tie_word_embeddings and name == "lm_head.weight"):
                continue
            self._load_one(params, name, tensor, check)
        expected = [c for p in params for c in STACKED.to_checkpoint(p)]
        check.finish(expected)
        return set(params)

    def _load_one(self, params: dict, name: str, tensor: torch.Tensor, check: WeightCheck) -> None:
        param_name, shard = STACKED.to_param(name)
        param = params.get(param_name)
        if param is None:
            check.unexpected.append(name)
            return
        loader = getattr(param, "weight_loader", default_weight_loader)
        try:
            loader(param, tensor) if shard is None else loader(param, tensor, shard)
        except ValueError as err:
            check.mis_shaped.append(f"{name}: {err}")
            return
        check.seen.add(name)


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral: the Llama layout, every layer sliding over `sliding_window` when it is set."""

    arch_spec = MistralSpec


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2: bias on q/k/v (not on o_proj); sliding windows on the layers `layer_types` (or
    use_sliding_window / max_window_layers) marks."""

    arch_spec = Qwen2Spec


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3: per-head RMSNorm on q and k before RoPE; `attention_bias` on q/k/v/o."""

    arch_spec = Qwen3Spec
