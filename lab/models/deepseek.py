"""DeepSeek-V2 / V3: multi-head latent attention (MLA) + mixture of experts, as transformers runs them.

What V2 and V3 are from the config alone (MLA spec, MoE layers, rope layout, router groups) is
lab/models/deepseek_arch.py's. Same frame as lab/models/llama.py (flat token batch, explicit
backend and metadata, LayerOps for norm / rotary / activation / experts). Attention (H heads, L = kv_lora_rank, R = qk_rope_head_dim,
N = qk_nope_head_dim, V = v_head_dim; the latent cache and the math: lab/attention/mla.py):

    q        = q_proj(h)  or  q_b_proj(q_a_layernorm(q_a_proj(h)))   [T, H, N + R] | q_nope | q_pe |
    latent   = kv_a_proj_with_mqa(h)                                 [T, L + R]    | kv_c | k_pe |
    kv_c     = kv_a_layernorm(kv_c);  q_pe, k_pe = rope(q_pe, k_pe)   (k_pe: one head for all)
    out      = backend.forward_mla(q_nope, q_pe, kv_c, k_pe, ...)     [T, H, V] -> o_proj

Rotary touches the R dims only; its layout follows each family's transformers code:

    V2                  interleaved pairs (x0, x1), (x2, x3), ... (complex multiply) -> gptj
    V3 rope_interleave  the same pairs, but HF writes the result de-interleaved | evens | odds |:
                        we de-interleave first, then rotate halves (neox): HF's math exactly
    V3 otherwise        neox

Yarn: cos/sin carry the attention factor (from mscale / mscale_all_dim) and the softmax scale is
(N + R)^-0.5 · mscale(factor, mscale_all_dim)^2. Layer i's MLP is MoE iff n_routed_experts is set,
i >= first_k_dense_replace and i % moe_layer_freq == 0 (transformers ignores moe_layer_freq;
released checkpoints use 1), else a dense gated MLP. The routers are lab/layers/moe.py's.

Tensor parallel over `tp` (lab/layers/linear.py): each rank attends with H/tp heads. q_proj /
q_b_proj and kv_b_proj are column-parallel by heads (their rows are head-major), o_proj is
row-parallel; the latent projections q_a_proj and kv_a_proj_with_mqa are replicated, so every
rank caches the same latent rows (L + R per token) for its heads. Dense MLPs as Llama; MoE:
router replicated, routed experts split per expert (default) or whole experts per rank
(`expert_parallel`), shared experts column/row-parallel, one all-reduce for both.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

import torch
from torch import nn

from lab.attention.base import AttentionBackend
from lab.attention.mla import MLAWeights
from lab.distributed.parallel_state import GroupCoordinator
from lab.layers.decoder import DecoderStack, GatedMLP, PreNormDecoderLayer, check_silu
from lab.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from lab.layers.linear import (
    ColumnParallelLinear,
    Linear,
    RowParallelLinear,
    default_weight_loader,
)
from lab.layers.moe import (
    FusedExperts,
    MoE,
    SigmoidGroupTopKGate,
    SoftmaxTopKGate,
    expert_checkpoint_names,
    expert_param_name,
)
from lab.layers.norm import RMSNorm
from lab.layers.ops import LayerOps
from lab.layers.rotary import RotaryEmbedding, rope_parameters
from lab.models.base import CausalLM
from lab.models.deepseek_arch import DeepseekV2Spec, DeepseekV3Spec, check_moe_tp, is_moe_layer
from lab.models.weight_utils import StackedMapping, WeightCheck

STACKED = StackedMapping((("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1)))
SKIPPED = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
LAYER_NAME = re.compile(r"^model\.layers\.(\d+)\.")


def yarn_softmax_scale(cfg) -> float:
    """(N + R)^-0.5, times mscale^2 when yarn sets mscale_all_dim (transformers' yarn_apply_mscale)."""
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    mscale_all_dim = params.get("mscale_all_dim") or 0
    if params.get("rope_type", "default") != "default" and mscale_all_dim:
        factor = params["factor"]
        mscale = 1.0 if factor <= 1 else 0.1 * mscale_all_dim * math.log(factor) + 1.0
        scale = scale * mscale * mscale
    return scale


def mla_rotary(cfg, style: str, ops: LayerOps) -> RotaryEmbedding:
    """The R-dim rotary of an MLA model (inverse frequencies and yarn factor as transformers)."""
    inv_freq, scaling = rope_parameters(cfg, cfg.qk_rope_head_dim)
    return RotaryEmbedding(inv_freq, cfg.max_position_embeddings, scaling,
                           is_neox=style != "gptj", ops=ops)


class DeepseekAttention(nn.Module):
    """MLA: low-rank q (optional), latent kv, decoupled rope; the backend's forward_mla attends."""

    def __init__(self, cfg, layer_idx: int, backend: AttentionBackend, rotary: RotaryEmbedding,
                 rope_style: str, ops: LayerOps, tp: GroupCoordinator):
        super().__init__()
        self.layer_idx, self.backend, self.rotary_emb = layer_idx, backend, rotary
        self.spec = DeepseekV2Spec.attention_spec(cfg, tp.world_size)  # this rank's heads
        h, n, r, lat = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
        bias = DeepseekV2Spec.attention_bias(cfg)
        self.q_lora_rank = cfg.q_lora_rank
        if self.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(cfg.hidden_size, h * (n + r), tp=tp)
        else:
            self.q_a_proj = Linear(cfg.hidden_size, self.q_lora_rank, bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, ops=ops)  # HF: default eps 1e-6
            self.q_b_proj = ColumnParallelLinear(self.q_lora_rank, h * (n + r), tp=tp)
        self.kv_a_proj_with_mqa = Linear(cfg.hidden_size, lat + r, bias)
        self.kv_a_layernorm = RMSNorm(lat, ops=ops)
        self.kv_b_proj = ColumnParallelLinear(lat, h * (n + cfg.v_head_dim), tp=tp)
        self.o_proj = RowParallelLinear(h * cfg.v_head_dim, cfg.hidden_size, bias, tp=tp)
        self.scale = yarn_softmax_scale(cfg)
        # V3 rope_interleave: | x0 x1 x2 x3 ... | -> | x0 x2 ... | x1 x3 ... | before a neox rotation
        order = torch.cat((torch.arange(0, r, 2), torch.arange(1, r, 2)))
        self.register_buffer("deinterleave", order if rope_style == "deinterleave" else None,
                             persistent=False)
        self._mla: MLAWeights | None = None

    def mla_weights(self) -> MLAWeights:
        """Views of kv_b_proj's weight for the backend, rebuilt if the weight was replaced (not
        checked under torch.compile, which cannot trace data_ptr: lab/compile builds them
        before it traces)."""
        stale = self._mla is None or (not torch.compiler.is_compiling() and
                                      self._mla.w_uk.data_ptr() != self.kv_b_proj.weight.data_ptr())
        if stale:
            self._mla = MLAWeights.from_kv_b_proj(self.kv_b_proj, self.spec)
        return self._mla

    def forward(self, h: torch.Tensor, positions: torch.Tensor, kv_cache, metadata) -> torch.Tensor:
        spec, t = self.spec, h.shape[0]
        if self.q_lora_rank is None:
            q = self.q_proj(h)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(h)))
        q_nope, q_pe = q.view(t, spec.num_heads, -1).split(
            (spec.qk_nope_head_dim, spec.qk_rope_head_dim), dim=-1)
        kv_c, k_pe = self.kv_a_proj_with_mqa(h).split((spec.kv_lora_rank, spec.qk_rope_head_dim), -1)
        kv_c = self.kv_a_layernorm(kv_c.contiguous())
        k_pe = k_pe.unsqueeze(1)  # [T, 1, R]
        if self.deinterleave is not None:
            q_pe, k_pe = q_pe[..., self.deinterleave], k_pe[..., self.deinterleave]
        q_pe, k_pe = self.rotary_emb(positions, q_pe, k_pe)
        out = self.backend.forward_mla(self.layer_idx, q_nope, q_pe, kv_c, k_pe[:, 0], kv_cache,
                                       metadata, self.mla_weights(), self.scale)
        return self.o_proj(out.reshape(t, -1))


class DeepseekDecoderLayer(PreNormDecoderLayer):
    """Pre-norm MLA + (MoE or dense MLP), carrying the residual stream like LlamaDecoderLayer."""

    def __init__(self, cfg, layer_idx: int, backend: AttentionBackend, rotary: RotaryEmbedding,
                 rope_style: str, gate: nn.Module | None, ops: LayerOps, tp: GroupCoordinator,
                 expert_parallel: bool):
        super().__init__()
        self.self_attn = DeepseekAttention(cfg, layer_idx, backend, rotary, rope_style, ops, tp)
        check_silu(cfg)
        bias = bool(getattr(cfg, "mlp_bias", False))
        if gate is None:
            self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, ops, bias, tp)
        else:
            inter = cfg.moe_intermediate_size
            shared = cfg.n_shared_experts or 0
            experts = FusedExperts(cfg.n_routed_experts, cfg.hidden_size, inter, ops, tp=tp,
                                   expert_parallel=expert_parallel)
            shared_mlp = GatedMLP(cfg.hidden_size, inter * shared, ops, bias, tp,
                                  reduce_results=False) if shared else None
            self.mlp = MoE(gate, experts, shared_mlp, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops=ops)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops=ops)



class DeepseekModel(DecoderStack):
    """Embedding, decoder layers, final norm (HF's `model.` prefix)."""

    def __init__(self, cfg, backend: AttentionBackend, rope_style: str, make_gate, ops: LayerOps,
                 tp: GroupCoordinator, expert_parallel: bool):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp=tp)
        self.rotary_emb = mla_rotary(cfg, rope_style, ops)
        self.layers = nn.ModuleList(
            DeepseekDecoderLayer(cfg, i, backend, self.rotary_emb, rope_style,
                                 make_gate(cfg) if is_moe_layer(cfg, i) else None, ops, tp,
                                 expert_parallel)
            for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops=ops)


def checkpoint_names(param_name: str, num_experts: int | None) -> list[str]:
    """The checkpoint tensors that fill a DeepSeek parameter: every expert's (any rank's) for
    stacked experts, gate and up for a fused gate_up_proj, else its own name."""
    if param_name.endswith((".experts.w13", ".experts.w2")):
        return expert_checkpoint_names(param_name, num_experts)
    return STACKED.to_checkpoint(param_name)


def load_tensor(params: dict[str, nn.Parameter], name: str, tensor: torch.Tensor,
                check: WeightCheck, num_experts: int | None, report_as: str | None = None) -> None:
    """Load one checkpoint tensor, named as the parameters are (`name`), into its parameter
    (its expert's slot of w13 / w2, its half of gate_up_proj, or all of it) with the
    parameter's weight_loader; record it in `check` as seen, unexpected (no such parameter, an
    expert past num_experts) or mis-shaped, under `report_as` (None: `name`)."""
    report_as = report_as or name
    param_name, shard = expert_param_name(name) or STACKED.to_param(name)
    param = params.get(param_name)
    if param is None or (isinstance(shard, tuple) and shard[0] >= (num_experts or 0)):
        check.unexpected.append(report_as)
        return
    loader = getattr(param, "weight_loader", default_weight_loader)
    try:
        loader(param, tensor) if shard is None else loader(param, tensor, shard)
    except ValueError as err:
        check.mis_shaped.append(f"{report_as}: {err}")
        return
    check.seen.add(report_as)


class DeepseekV2ForCausalLM(CausalLM):
    """DeepSeek-V2 (and V2-Lite / V2.5): MLA + softmax-routed MoE, interleaved (gptj) rope."""

    # linears a quant method must leave dense (lab/quant/base.py): MLA reads kv_b_proj's weight
    # as per-head views w_uk / w_uv (lab/attention/mla.py MLAWeights)
    dense_linears = ("kv_b_proj",)

    arch_spec = DeepseekV2Spec

    @classmethod
    def make_gate(cls, cfg) -> nn.Module:
        """The router of a MoE layer. transformers' V2 ignores norm_topk_prob (released V2
        checkpoints set it false), and so does this."""
        n_group, topk_group = cls.arch_spec.router_groups(cfg)
        return SoftmaxTopKGate(cfg.n_routed_experts, cfg.hidden_size, cfg.num_experts_per_tok,
                               n_group, topk_group, cfg.routed_scaling_factor)

    def __init__(self, hf_config, attn_backend: AttentionBackend, ops: LayerOps | None = None,
                 tp: GroupCoordinator | None = None, expert_parallel: bool = False):
        super().__init__(hf_config, attn_backend, ops, tp, expert_parallel)
        cfg = hf_config
        check_moe_tp(cfg, self.tp.world_size, expert_parallel)
        self.num_extra_layers = getattr(cfg, "num_nextn_predict_layers", 0) or 0  # V3's MTP
        self.tie_word_embeddings = bool(getattr(cfg, "tie_word_embeddings", False))
        self.model = DeepseekModel(cfg, attn_backend, self.arch_spec.rope_style(cfg),
                                   self.make_gate, self.ops, self.tp, expert_parallel)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tp=self.tp)
        if self.tie_word_embeddings:
            self.lm_head.tie(self.model.embed_tokens)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], attn_metadata: object) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden], after model.norm (as
        vLLM's: what the MTP layers take as previous_hidden, lab/models/deepseek_mtp.py)."""
        return self.model(input_ids, positions, kv_caches, attn_metadata)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Hidden [N, hidden] -> float32 logits [N, vocab] on the TP group's rank 0 (None on
        the others; every rank calls it)."""
        return self.lm_head(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named tensors (stacking experts, fusing gate/up); strict: raises ValueError
        naming every missing, unexpected and mis-shaped tensor. Returns the parameters' names.
        Multi-token-prediction layers (V3's num_nextn_predict_layers) are skipped."""
        params = dict(self.named_parameters())
        check = WeightCheck()
        experts = self.config.n_routed_experts
        for name, tensor in weights:
            if not self._skipped(name):
                load_tensor(params, name, tensor, check, experts)
        check.finish(c for p in params for c in checkpoint_names(p, experts))
        return set(params)

    def _skipped(self, name: str) -> bool:
        if name.endswith(SKIPPED) or (self.tie_word_embeddings and name == "lm_head.weight"):
            return True
        layer = LAYER_NAME.match(name)
        return layer is not None and (
            self.num_layers <= int(layer.group(1)) < self.num_layers + self.num_extra_layers)


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    """DeepSeek-V3 / R1: sigmoid-scored, bias-corrected group-limited routing (noaux_tc);
    rope on interleaved pairs (rope_interleave, HF's default) or rotated halves."""

    arch_spec = DeepseekV3Spec

    @classmethod
    def make_gate(cls, cfg) -> nn.Module:
        n_group, topk_group = cls.arch_spec.router_groups(cfg)
        return SigmoidGroupTopKGate(
            cfg.n_routed_experts, cfg.hidden_size, cfg.num_experts_per_tok, n_group, topk_group,
            bool(cfg.norm_topk_prob), cfg.routed_scaling_factor)
