"""gpt-oss: the Llama layout with attention sinks, sliding / full layers and a biased MoE on every
layer, as transformers runs it (dense bf16 / fp32 weights; MXFP4 checkpoints are refused:
lab/models/gpt_oss_arch.py).

    attention   q/k/v/o with biases, YaRN RoPE (rope_parameters), each layer's window
                (`layer_types`) and a learned sink logit per head (`self_attn.sinks`, fp32:
                one more column in every softmax, with no value) passed to the backend
    router      logits = x W^T + b; the top-k logits, then softmax over those k (transformers'
                GptOssTopKRouter: not a softmax over every expert)
    experts     transformers' layout, x @ W (not W^T):
                    gate_up_proj [E, hidden, 2I]  columns interleaved  g0 u0 g1 u1 ...
                    down_proj    [E, I, hidden]   (+ gate_up_proj_bias [E, 2I], down_proj_bias)
                gate = min(g, limit), up = clamp(u, -limit, limit),
                out = down((up + 1) * gate * sigmoid(alpha * gate)) + down bias, weighted by the
                token's routing weight (swiglu_alpha, swiglu_limit); a plain loop over the
                experts a step routes to (the fused MoE op's SiLU·mul is another activation),
                one custom op (`lab::gpt_oss_experts`) so that compile=true's trace leaves the
                data-dependent loop opaque, as it does lab's fused MoE

Tensor parallel over `tp`: attention as Llama's (the sinks split with the heads); the router is
replicated; each expert's intermediate dim is split (rank r: gate/up columns [2rI', 2(r+1)I'),
whole gate/up pairs thanks to the interleaving, and down rows [rI', (r+1)I'); the down bias on
rank 0 only), or with `expert_parallel` E/tp whole experts per rank; the MoE output is
all-reduced once. Norms are RMSNorm through the model's ops (transformers multiplies the weight
in float32 before the cast back: the same in float32, one rounding apart in bf16).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from lab.attention.base import AttentionBackend
from lab.attention.spec import AttentionSpec
from lab.distributed.parallel_state import GroupCoordinator
from lab.layers.decoder import DecoderStack, PreNormDecoderLayer
from lab.layers.embedding import VocabParallelEmbedding
from lab.layers.linear import default_weight_loader
from lab.layers.norm import RMSNorm
from lab.layers.ops import LayerOps
from lab.layers.rotary import RotaryEmbedding
from lab.models.gpt_oss_arch import GptOssSpec, check_moe_tp
from lab.models.llama import LlamaAttention, LlamaForCausalLM
from lab.models.llama_arch import LlamaArch, head_dim_of


class GptOssAttention(LlamaAttention):
    """LlamaAttention (biased q/k/v/o) with a sink logit per head of this rank, fp32."""

    def __init__(self, cfg, arch: LlamaArch, layer_idx: int, spec: AttentionSpec,
                 backend: AttentionBackend, rotary_emb: RotaryEmbedding, ops: LayerOps,
                 tp: GroupCoordinator):
        super().__init__(cfg, arch, layer_idx, spec, backend, rotary_emb, ops, tp)
        heads = self.qkv_proj.num_heads
        self.heads_start = tp.rank_in_group * heads
        self.sinks = nn.Parameter(torch.empty(heads, dtype=torch.float32), requires_grad=False)
        self.sinks.weight_loader = self.load_sinks

    def load_sinks(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        """This rank's heads of the checkpoint's sinks [num_attention_heads] (fp32 kept)."""
        full = self.qkv_proj.total_num_heads
        if tuple(loaded.shape) != (full,):
            raise ValueError(f"expected shape {(full,)}, found {tuple(loaded.shape)}")
        default_weight_loader(param, loaded.narrow(0, self.heads_start, param.numel()).float())

    def attend(self, q, k, v, kv_cache, metadata) -> torch.Tensor:
        return self.backend.forward(self.layer_idx, q, k, v, kv_cache, metadata, self.scale,
                                    sinks=self.sinks, **self.attn_kwargs)


class GptOssRouter(nn.Module):
    """transformers' GptOssTopKRouter, replicated on every rank (not a Linear: no quant method
    touches it): -> (routing weights [T, k] in x's dtype, expert ids [T, k])."""

    def __init__(self, num_experts: int, hidden_size: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(num_experts), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x, self.weight, self.bias)
        top, ids = torch.topk(logits, self.top_k, dim=-1)
        return torch.softmax(top, dim=-1, dtype=top.dtype), ids


class GptOssExperts(nn.Module):
    """This rank's part of the E experts in transformers' layout (module docstring): every
    expert's intermediate slice (tensor parallel), or E/tp whole experts (expert_parallel).
    Returns this rank's partial sum (the MoE layer all-reduces it)."""

    # per parameter: the dim its intermediate slice narrows (None: hidden only, the down bias)
    SPLIT_DIMS = {"gate_up_proj": 2, "gate_up_proj_bias": 1, "down_proj": 1,
                  "down_proj_bias": None}

    def __init__(self, cfg, tp: GroupCoordinator, expert_parallel: bool):
        super().__init__()
        self.tp = tp
        self.expert_parallel = expert_parallel and tp.world_size > 1
        self.num_experts, self.intermediate_size = cfg.num_local_experts, cfg.intermediate_size
        e, i, h = self.num_experts, self.intermediate_size, cfg.hidden_size
        if self.expert_parallel:
            e //= tp.world_size
        else:
            i //= tp.world_size
        self.num_local, self.intermediate_per_rank = e, i
        self.expert_start = tp.rank_in_group * e if self.expert_parallel else 0
        self.alpha, self.limit = cfg.swiglu_alpha, cfg.swiglu_limit
        shapes = {"gate_up_proj": (e, h, 2 * i), "gate_up_proj_bias": (e, 2 * i),
                  "down_proj": (e, i, h), "down_proj_bias": (e, h)}
        for name, shape in shapes.items():
            param = nn.Parameter(torch.empty(shape), requires_grad=False)
            param.weight_loader = partial(self.weight_loader, name)
            self.register_parameter(name, param)

    def weight_loader(self, name: str, param: nn.Parameter, loaded: torch.Tensor) -> None:
        """This rank's part of the unsharded expert tensor `name`: its experts (expert_parallel)
        or every expert's intermediate slice, gate/up columns 2I' wide (whole interleaved
        pairs); the down bias of a split expert on rank 0, zeros elsewhere (added once)."""
        full = (self.num_experts, *param.shape[1:])
        dim = self.SPLIT_DIMS[name]
        if not self.expert_parallel and dim is not None:
            full = (*full[:dim], full[dim] * self.tp.world_size, *full[dim + 1:])
        if tuple(loaded.shape) != full:
            raise ValueError(f"expected shape {full}, found {tuple(loaded.shape)}")
        if self.expert_parallel:
            loaded = loaded.narrow(0, self.expert_start, self.num_local)
        elif dim is not None:
            width = param.shape[dim]
            loaded = loaded.narrow(dim, self.tp.rank_in_group * width, width)
        elif self.tp.rank_in_group != 0:
            loaded = torch.zeros_like(loaded)
        default_weight_loader(param, loaded)

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return gpt_oss_experts(x, self.gate_up_proj, self.gate_up_proj_bias, self.down_proj,
                               self.down_proj_bias, weights, ids - self.expert_start,
                               self.alpha, self.limit)


def clamped_swiglu(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """transformers' clamped SwiGLU over interleaved | g0 u0 g1 u1 ... | columns."""
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


@torch.library.custom_op("lab::gpt_oss_experts", mutates_args=())
def gpt_oss_experts(x: torch.Tensor, gate_up: torch.Tensor, gate_up_bias: torch.Tensor,
                    down: torch.Tensor, down_bias: torch.Tensor, weights: torch.Tensor,
                    local_ids: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """x [T, hidden] through the experts each token is routed to (`local_ids` [T, k]: indices
    into this rank's experts, others' out of range and skipped), weighted by `weights` [T, k]
    and summed per token -> [T, hidden]; the experts in ascending order, as transformers' loop."""
    out = torch.zeros_like(x)
    for e in local_ids.unique().tolist():
        if not 0 <= e < gate_up.shape[0]:
            continue  # another rank's expert
        tokens, slot = torch.where(local_ids == e)
        y = clamped_swiglu(x[tokens] @ gate_up[e] + gate_up_bias[e], alpha, limit)
        y = y @ down[e] + down_bias[e]
        out.index_add_(0, tokens, (y * weights[tokens, slot, None]).to(x.dtype))
    return out


@gpt_oss_experts.register_fake
def _gpt_oss_experts_fake(x, gate_up, gate_up_bias, down, down_bias, weights, local_ids, alpha,
                          limit):
    return torch.empty_like(x)


class GptOssMoE(nn.Module):
    """HF's `mlp`: router + experts, all-reduced once over `tp`."""

    def __init__(self, cfg, tp: GroupCoordinator, expert_parallel: bool):
        super().__init__()
        self.tp = tp
        self.router = GptOssRouter(cfg.num_local_experts, cfg.hidden_size,
                                   cfg.num_experts_per_tok)
        self.experts = GptOssExperts(cfg, tp, expert_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.router(x)
        return self.tp.all_reduce(self.experts(x, weights, ids))


class GptOssDecoderLayer(PreNormDecoderLayer):
    """Pre-norm attention with sinks + MoE, carrying the residual stream like Llama's."""

    def __init__(self, cfg, arch: LlamaArch, layer_idx: int, spec: AttentionSpec,
                 backend: AttentionBackend, rotary_emb: RotaryEmbedding, ops: LayerOps,
                 tp: GroupCoordinator, expert_parallel: bool):
        super().__init__()
        self.self_attn = GptOssAttention(cfg, arch, layer_idx, spec, backend, rotary_emb, ops, tp)
        self.mlp = GptOssMoE(cfg, tp, expert_parallel)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops=ops)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops=ops)


class GptOssModel(DecoderStack):
    """Embedding, decoder layers, final norm (HF's `model.` prefix); one YaRN RoPE shared."""

    def __init__(self, cfg, arch: LlamaArch, layer_specs: list[AttentionSpec],
                 backend: AttentionBackend, ops: LayerOps, tp: GroupCoordinator,
                 expert_parallel: bool):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp=tp)
        self.rotary_emb = RotaryEmbedding.from_hf_config(cfg, head_dim_of(cfg), ops=ops)
        self.layers = nn.ModuleList(
            GptOssDecoderLayer(cfg, arch, i, spec, backend, self.rotary_emb, ops, tp,
                               expert_parallel)
            for i, spec in enumerate(layer_specs))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops=ops)


class GptOssForCausalLM(LlamaForCausalLM):
    """gpt-oss (dense weights): sinks, sliding / full layers, a biased MoE on every layer."""

    arch_spec = GptOssSpec

    def build_stack(self, cfg, attn_backend: AttentionBackend) -> nn.Module:
        return GptOssModel(cfg, self.arch_spec.arch(cfg), self.layer_specs, attn_backend,
                           self.ops, self.tp, self.expert_parallel)

    @classmethod
    def check_tp(cls, cfg, tp_size: int, expert_parallel: bool) -> None:
        check_moe_tp(cfg, tp_size, expert_parallel)
