"""A model's shape from its Hugging Face config alone (no weights): parameter counts (total and
active per token), FLOPs per token, KV-cache bytes per token. What the simulator plans its cache
and predicts its step times from.

Families: Llama-style (Llama, Mistral, Qwen2 with q/k/v bias, Qwen3 with per-head q/k norms,
Gemma-2 / Gemma-3 with four norms a layer), DeepSeek (MLA attention, MoE MLP), gpt-oss
(Llama-style attention with biases and a sink logit per head, a MoE with biases on every layer). What differs between families is asked of the architecture's
spec, the torch-free half of lab's model classes that the classes build their layers from
(`arch_spec`, lab/models/registry.py): the attention spec (`attention_spec`, whose
`kv_elems_per_token` the backends size the cache by), a Llama family's `arch` (biases, q/k
norms), DeepSeek's `attention_bias`, MoE layers (`is_moe_layer`) and router (`router_params`),
so the counts equal the loaded models' without importing any model code.

Per decoder layer, a Llama-style model holds

    | q, k, v, o projections | gate, up, down (MLP) | 2 RMSNorms (Gemma: 4) | (q/k norms, biases) |

a DeepSeek layer

    | q (or q_a, q_a_norm, q_b) | kv_a_with_mqa, kv_a_norm, kv_b | o | dense MLP or MoE | 2 norms |

where a layer is MoE iff experts exist, layer >= first_k_dense_replace and
layer % moe_layer_freq == 0 (lab/models/deepseek_arch.py's is_moe_layer), and a gpt-oss layer
(MoE, every one)

    | q, k, v, o (+ biases) | sinks | router (+ bias) | experts gate_up, down (+ biases) | 2 norms |

Tensor parallelism: `from_hf_config(cfg, tensor_parallel_size=tp)` is the shape of one of tp
ranks, split as lab's real TP splits the model (lab/layers/linear.py, embedding.py, moe.py), so
every count below (parameters, weight bytes, FLOPs, KV bytes) is that rank's:

    q heads, q/kv_b (MLA) projections     / tp                 (column-parallel)
    kv heads (GQA)                        / tp, or 1 replicated when tp > kv heads
    o_proj, MLP gate/up/down              / tp                 (column / row-parallel)
    embedding, LM head                    ceil(vocab / tp) rows (vocab-parallel, padded)
    routed experts                        each expert's width / tp, or (expert_parallel) E / tp
                                          whole experts and, routing balanced, top_k / tp of a
                                          token's pairs
    shared experts                        width / tp
    attention sinks (gpt-oss)             / tp                 (with the heads)
    expert biases (gpt-oss)               gate_up's with the width; down's whole on every rank
    norms, MLA's q_a / kv_a projections   whole on every rank (replicated), and so MLA's latent
    and the MoE router                    cache: every rank caches the same L + R per token

The config fields `tp` must divide are refused as the model classes refuse them (the arch
spec's checks: heads, kv heads, intermediate sizes, experts).

Sliding windows: `layer_windows` holds each layer's window as the architecture's spec gives it
(`layer_attention_specs`: None for a full-attention layer; the specs the simulator groups the
KV cache by, as the worker does: lab/executor/sim.py), what the roofline counts a layer's
attention over (lab/sim/step_time/roofline.py). KV bytes per token are the same in every layer
(one KV layout, `kv_bytes_per_token_per_layer`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from lab.models.arch import check_tp_divisible
from lab.models.deepseek_arch import DeepseekV2Spec, check_moe_tp, is_moe_layer
from lab.models.gpt_oss_arch import GptOssSpec
from lab.models.gpt_oss_arch import check_moe_tp as check_gpt_oss_tp
from lab.models.registry import arch_spec

# bytes per linear weight of lab's quant methods (by their QuantConfig class, the `quant` option's
# _target_) and of checkpoints' own quantization_config (by its quant_method)
QUANT_WEIGHT_BYTES = {"Fp8Config": 1.0, "Int8Config": 1.0, "W4A16Config": 0.5,
                      "fp8": 1.0, "int8": 1.0, "w4a16": 0.5}


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    value = getattr(cfg, name, default)
    return default if value is None else value


@dataclass(frozen=True)
class ModelShape:
    """The counts of a decoder-only transformer that step times and memory depend on: of the
    whole model, or of one tensor-parallel rank (module docstring)."""

    num_layers: int
    hidden_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int  # q/k/v head width (Llama-style); MLA: qk_nope + qk_rope
    intermediate_size: int  # dense MLP
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    mlp_bias: bool = False
    post_norms: bool = False  # Gemma: a norm after attention and after the MLP too
    attention_sinks: bool = False  # gpt-oss: one learned logit per head and layer
    kv_elems_per_token: int = 0  # per layer (AttentionSpec.kv_elems_per_token)
    # MLA (DeepSeek): kv_lora_rank > 0
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # MoE (DeepSeek)
    n_routed_experts: int = 0
    num_experts_per_tok: float = 0  # expert_parallel ranks: top_k / tp (balanced routing)
    n_shared_experts: float = 0  # in routed experts' widths (expert_parallel ranks: / tp)
    moe_intermediate_size: int = 0
    first_k_dense_replace: int = 0
    moe_layer_freq: int = 1
    router_params: int = 0  # of one MoE layer's router (V3's correction bias included)
    expert_bias: bool = False  # gpt-oss: biases on each expert's gate_up and down
    # tensor parallelism: this shape is one of `tensor_parallel_size` ranks (module docstring)
    tensor_parallel_size: int = 1
    expert_parallel: bool = False
    # each layer's sliding window (None: full attention); () when every layer is full
    layer_windows: tuple[int | None, ...] = ()

    def __post_init__(self) -> None:
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ValueError(f"{len(self.layer_windows)} layer windows for a model of "
                             f"{self.num_layers} layers")

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, cfg: Any, tensor_parallel_size: int = 1,
                       expert_parallel: bool = False) -> ModelShape:
        """From a transformers PretrainedConfig of an architecture lab supports: the whole
        model, or one of `tensor_parallel_size` ranks (`expert_parallel`: MoE layers hold
        whole experts per rank); ValueError naming a config field tp does not divide."""
        tp = int(tensor_parallel_size)
        if tp < 1:
            raise ValueError(f"tensor_parallel_size={tp} must be >= 1")
        family = arch_spec(cfg)
        spec = family.attention_spec(cfg, tp)  # this rank's heads (the spec checks them)
        common = dict(
            num_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size,
            vocab_size=-(-cfg.vocab_size // tp), num_heads=spec.num_heads,
            num_kv_heads=spec.num_kv_heads, intermediate_size=cfg.intermediate_size // tp,
            tie_word_embeddings=bool(_get(cfg, "tie_word_embeddings", False)),
            layer_windows=layer_windows(family.layer_attention_specs(cfg, tp)),
            kv_elems_per_token=spec.kv_elems_per_token, tensor_parallel_size=tp,
            expert_parallel=bool(expert_parallel) and tp > 1)
        if spec.kind == "mla":
            return cls._deepseek(cfg, family, common)
        if issubclass(family, GptOssSpec):
            return cls._gpt_oss(cfg, family, spec.head_dim, common)
        check_tp_divisible(cfg, tp, ("intermediate_size",))  # as LlamaForCausalLM does
        flags = family.arch(cfg)
        return cls(**common, head_dim=spec.head_dim, qkv_bias=flags.qkv_bias,
                   o_bias=flags.o_bias, qk_norm=flags.qk_norm, mlp_bias=flags.mlp_bias,
                   post_norms=flags.post_norms)

    @classmethod
    def _deepseek(cls, cfg: Any, family: type[DeepseekV2Spec], common: dict) -> ModelShape:
        """An MLA (+ MoE) shape; `family`: the config's spec (lab/models/deepseek_arch.py)."""
        tp, ep = common["tensor_parallel_size"], common["expert_parallel"]
        check_moe_tp(cfg, tp, ep)
        nope, rope = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        experts = _get(cfg, "n_routed_experts", 0)
        top_k = _get(cfg, "num_experts_per_tok", 0)
        shared = _get(cfg, "n_shared_experts", 0)
        moe_width = _get(cfg, "moe_intermediate_size", 0)
        if ep:  # whole experts, E / tp of them; the shared experts still split by width
            experts, top_k, shared = experts // tp, top_k / tp, shared / tp
        else:
            moe_width //= tp
        bias = family.attention_bias(cfg)
        return cls(
            **common, head_dim=nope + rope, kv_lora_rank=cfg.kv_lora_rank,
            q_lora_rank=_get(cfg, "q_lora_rank", 0), qk_nope_head_dim=nope,
            qk_rope_head_dim=rope, v_head_dim=cfg.v_head_dim, qkv_bias=bias, o_bias=bias,
            n_routed_experts=experts, num_experts_per_tok=top_k, n_shared_experts=shared,
            moe_intermediate_size=moe_width,
            first_k_dense_replace=_get(cfg, "first_k_dense_replace", 0),
            moe_layer_freq=_get(cfg, "moe_layer_freq", 1),
            router_params=family.router_params(cfg) if experts else 0)

    @classmethod
    def _gpt_oss(cls, cfg: Any, family: type[GptOssSpec], head_dim: int,
                 common: dict) -> ModelShape:
        """gpt-oss: every layer MoE (experts split by width, or whole with expert_parallel), no
        shared experts; attention biases and sinks (lab/models/gpt_oss_arch.py)."""
        tp, ep = common["tensor_parallel_size"], common["expert_parallel"]
        check_gpt_oss_tp(cfg, tp, ep)
        flags = family.arch(cfg)
        experts, top_k, width = cfg.num_local_experts, cfg.num_experts_per_tok, cfg.intermediate_size
        if ep:
            experts, top_k = experts // tp, top_k / tp
        else:
            width //= tp
        return cls(**common, head_dim=head_dim, qkv_bias=flags.qkv_bias, o_bias=flags.o_bias,
                   attention_sinks=True, n_routed_experts=experts, num_experts_per_tok=top_k,
                   moe_intermediate_size=width, router_params=family.router_params(cfg),
                   expert_bias=True)

    # -- structure --------------------------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def is_moe_layer(self, layer: int) -> bool:
        """Whether `layer`'s MLP is MoE (the model's rule, read from this shape's fields)."""
        return is_moe_layer(self, layer)

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    def window_layers(self) -> dict[int | None, int]:
        """How many layers attend within each sliding window (None: full attention)."""
        return dict(Counter(self.layer_windows or (None,) * self.num_layers))

    # -- parameters -------------------------------------------------------------------------
    def attention_linear_params(self) -> int:
        """Weights of one layer's attention projections (biases excluded)."""
        h, heads = self.hidden_size, self.num_heads
        if not self.is_mla:
            q, kv = heads * self.head_dim, self.num_kv_heads * self.head_dim
            return h * q + 2 * h * kv + q * h
        q_out = heads * self.head_dim
        q = h * self.q_lora_rank + self.q_lora_rank * q_out if self.q_lora_rank else h * q_out
        kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)
        kv_b = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv_a + kv_b + heads * self.v_head_dim * h

    def attention_small_params(self) -> int:
        """Biases and norms of one layer's attention (not linear weights)."""
        heads = self.num_heads
        if not self.is_mla:
            n = self.qkv_bias * (heads + 2 * self.num_kv_heads) * self.head_dim
            n += self.o_bias * self.hidden_size + self.qk_norm * 2 * self.head_dim
            return n + self.attention_sinks * heads
        n = self.q_lora_rank + self.kv_lora_rank  # q_a_layernorm (if any), kv_a_layernorm
        if self.qkv_bias:  # attention_bias: on q_a (with a q LoRA), kv_a and o
            n += self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim
        return n + self.o_bias * self.hidden_size

    def mlp_params(self, layer: int) -> tuple[int, int, int]:
        """(dense-path weights, routed-expert weights, router params) of one layer's MLP."""
        h = self.hidden_size
        if not self.is_moe_layer(layer):
            return 3 * h * self.intermediate_size, 0, 0
        expert = 3 * h * self.moe_intermediate_size
        shared = round(self.n_shared_experts * expert)  # a whole count (expert_parallel: / tp)
        return shared, self.n_routed_experts * expert, self.router_params

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def linear_params(self) -> tuple[int, int]:
        """(dense linear weights of all layers, routed-expert weights of all layers); excludes
        the embedding and LM head."""
        dense = routed = 0
        for layer in range(self.num_layers):
            mlp, experts, _ = self.mlp_params(layer)
            dense += self.attention_linear_params() + mlp
            routed += experts
        return dense, routed

    def small_params(self) -> int:
        """Norms, biases and routers: parameters that are not linear weights or embeddings."""
        per_layer = (4 if self.post_norms else 2) * self.hidden_size
        per_layer += self.attention_small_params()
        mlp_biases = self.mlp_bias * sum(2 * self.intermediate_size + self.hidden_size
                                         for i in range(self.num_layers)
                                         if not self.is_moe_layer(i))
        routers = sum(self.mlp_params(i)[2] for i in range(self.num_layers)) + mlp_biases
        expert_biases = self.expert_bias * self.num_moe_layers * self.n_routed_experts * (
            2 * self.moe_intermediate_size + self.hidden_size)
        return (self.num_layers * per_layer + routers + expert_biases
                + self.hidden_size)  # + final norm

    @property
    def num_params(self) -> int:
        """Every parameter (tied embeddings counted once)."""
        dense, routed = self.linear_params()
        head = 0 if self.tie_word_embeddings else self.lm_head_params
        return self.embedding_params + head + dense + routed + self.small_params()

    @property
    def expert_params(self) -> int:
        """Weights of one routed expert."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def active_linear_params(self) -> int:
        """Linear weights one token multiplies through (top-k experts of each MoE layer; the LM
        head excluded: only sampled positions reach it)."""
        dense, _ = self.linear_params()
        return dense + self.num_moe_layers * self.num_experts_per_tok * self.expert_params

    @property
    def num_active_params(self) -> int:
        """Parameters one token uses: active linears, LM head, its embedding row, the rest."""
        return (self.active_linear_params + self.lm_head_params + self.hidden_size
                + self.small_params())

    def weight_bytes(self, dtype_bytes: float, linear_bytes: float | None = None) -> int:
        """Bytes of the parameters: linear weights (experts included) at `linear_bytes` each
        (quantized; default `dtype_bytes`), everything else at `dtype_bytes`."""
        linear_bytes = dtype_bytes if linear_bytes is None else linear_bytes
        dense, routed = self.linear_params()
        head = 0 if self.tie_word_embeddings else self.lm_head_params
        other = self.embedding_params + head + self.small_params()
        return int(round((dense + routed) * linear_bytes + other * dtype_bytes))

    # -- per token ----------------------------------------------------------------------------
    def kv_bytes_per_token_per_layer(self, kv_dtype_bytes: float) -> int:
        """KV-cache bytes of one token in one layer (the attention spec's elements per token:
        K and V of every KV head, or MLA's latent row): a block's page in one KV tensor is
        block_size of them (lab/attention/base.py's KVCacheSpec.page_bytes)."""
        return int(self.kv_elems_per_token * kv_dtype_bytes)

    def kv_bytes_per_token(self, kv_dtype_bytes: float) -> int:
        """KV-cache bytes of one token over all layers."""
        return self.num_layers * self.kv_bytes_per_token_per_layer(kv_dtype_bytes)

    def attention_dims(self, decode: bool) -> tuple[int, int]:
        """(query-key width, value width) per head and layer: what one query-key pair costs in
        multiply-adds. MLA decodes in the latent space (weights absorbed: L + R and L) and
        prefills expanded (nope + rope and v_head_dim), as vLLM's MLA does."""
        if not self.is_mla:
            return self.head_dim, self.head_dim
        if decode:
            return self.kv_lora_rank + self.qk_rope_head_dim, self.kv_lora_rank
        return self.head_dim, self.v_head_dim

    def attention_flops(self, pairs: float, decode: bool, layers: int | None = None) -> float:
        """FLOPs of `pairs` query-key pairs in each of `layers` layers (default: all of them),
        over all heads (scores + weighted sum)."""
        qk, v = self.attention_dims(decode)
        layers = self.num_layers if layers is None else layers
        return 2.0 * pairs * self.num_heads * (qk + v) * layers

    def flops_per_token(self, context: int = 0) -> float:
        """Forward FLOPs of one token attending to `context` keys: 2 x active linear params
        + LM head + attention."""
        linear = 2.0 * (self.active_linear_params + self.lm_head_params)
        return linear + self.attention_flops(context, decode=True)

    def activation_bytes(self, num_tokens: int, num_seqs: int, dtype_bytes: float) -> int:
        """A rough peak of a step's activations: per token the residual stream, attention
        inputs and outputs and the widest MLP hidden (gate + up), plus fp32 logits of one
        sampled position per sequence (over the whole vocabulary: with tensor parallelism,
        the rank the logits are gathered on)."""
        mlp = max(self.intermediate_size,
                  self.moe_intermediate_size * (self.num_experts_per_tok + self.n_shared_experts))
        attn = self.num_heads * self.head_dim + 2 * self.num_kv_heads * self.head_dim
        per_token = 4 * self.hidden_size + attn + 2 * mlp
        logits = num_seqs * self.vocab_size * self.tensor_parallel_size * 4
        return int(num_tokens * per_token * dtype_bytes + logits)


def layer_windows(specs) -> tuple[int | None, ...]:
    """The layers' sliding windows from their AttentionSpecs; () when no layer has one."""
    windows = tuple(spec.sliding_window for spec in specs)
    return windows if any(w is not None for w in windows) else ()
