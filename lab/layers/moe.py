"""Mixture of experts (DeepSeek-V2/V3 style): routers, stacked routed experts, shared experts.

    MoE(x) = Σ_j topk_weights[t, j] · expert_{topk_ids[t, j]}(x[t])  +  shared_experts(x)

Routers run in float32 on the router weight [E, hidden] (as transformers keeps `gate.weight`) and
return (topk_weights [T, k] float32, topk_ids [T, k]); the k ids of a token come in no particular
order. Both families scale the weights by routed_scaling_factor.

    softmax_topk        DeepSeek-V2: softmax scores; greedy top-k, or group-limited
                        (`group_limited_greedy`): keep the topk_group groups with the largest
                        single score, zero the others, then top-k
    sigmoid_group_topk  DeepSeek-V3 (`noaux_tc`): sigmoid scores; the choice adds the correction
                        bias and keeps the topk_group groups with the largest top-2 sum (others
                        -inf); the weights are the unbiased scores of the chosen experts,
                        renormalised to sum 1 when norm_topk_prob

Routed experts are stored stacked so one op computes them all (`LayerOps.fused_moe`):

    w13 [E, 2I, hidden]   rows | gate (I) | up (I) |    <- HF experts.{e}.gate_proj / up_proj
    w2  [E, hidden, I]                                  <- HF experts.{e}.down_proj
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from lab.distributed.parallel_state import GroupCoordinator
from lab.layers.linear import default_weight_loader, divide
from lab.layers.ops import LayerOps, TorchOps

# ---------------------------------------------------------------------------------------- routers


def _group_mask(group_scores: torch.Tensor, topk_group: int, num_experts: int) -> torch.Tensor:
    """[T, G] group scores -> bool [T, E]: True for the experts of each token's topk_group groups."""
    idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, idx, True)
    return keep.repeat_interleave(num_experts // group_scores.shape[-1], dim=-1)


def softmax_topk(
    logits: torch.Tensor, top_k: int, n_group: int | None = None, topk_group: int | None = None,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V2 routing on router logits [T, E]; n_group set = group-limited greedy."""
    scores = logits.softmax(dim=-1, dtype=torch.float32)
    if n_group:
        t, e = scores.shape
        group_scores = scores.view(t, n_group, e // n_group).max(dim=-1).values
        scores = scores.masked_fill(~_group_mask(group_scores, topk_group, e), 0.0)
    weights, ids = torch.topk(scores, k=top_k, dim=-1, sorted=False)
    return weights * routed_scaling_factor, ids


def sigmoid_group_topk(
    logits: torch.Tensor, bias: torch.Tensor, top_k: int, n_group: int, topk_group: int,
    norm_topk_prob: bool = True, routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 routing (noaux_tc) on router logits [T, E] with the correction bias [E]."""
    scores = logits.sigmoid()
    choice = scores + bias
    t, e = choice.shape
    group_scores = choice.view(t, n_group, e // n_group).topk(2, dim=-1)[0].sum(dim=-1)
    choice = choice.masked_fill(~_group_mask(group_scores, topk_group, e), float("-inf"))
    ids = torch.topk(choice, k=top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, ids)
    if norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * routed_scaling_factor, ids


class SoftmaxTopKGate(nn.Module):
    """The V2 router (HF `mlp.gate`): weight [E, hidden] in float32, `softmax_topk`."""

    def __init__(self, num_experts: int, hidden_size: int, top_k: int, n_group: int | None = None,
                 topk_group: int | None = None, routed_scaling_factor: float = 1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, dtype=torch.float32),
                                   requires_grad=False)
        self.top_k, self.n_group, self.topk_group = top_k, n_group, topk_group
        self.routed_scaling_factor = routed_scaling_factor

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Router logits [T, E] in float32."""
        return F.linear(x.float(), self.weight.float())

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return softmax_topk(self.logits(x), self.top_k, self.n_group, self.topk_group,
                            self.routed_scaling_factor)


class SigmoidGroupTopKGate(SoftmaxTopKGate):
    """The V3 router: weight [E, hidden] and e_score_correction_bias [E] in float32."""

    def __init__(self, num_experts: int, hidden_size: int, top_k: int, n_group: int,
                 topk_group: int, norm_topk_prob: bool = True, routed_scaling_factor: float = 1.0):
        super().__init__(num_experts, hidden_size, top_k, n_group, topk_group, routed_scaling_factor)
        self.norm_topk_prob = norm_topk_prob
        self.e_score_correction_bias = nn.Parameter(
            torch.zeros(num_experts, dtype=torch.float32), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return sigmoid_group_topk(
            self.logits(x), self.e_score_correction_bias.float(), self.top_k, self.n_group,
            self.topk_group, self.norm_topk_prob, self.routed_scaling_factor)


# ---------------------------------------------------------------------------------------- experts

EXPERT_NAME = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
EXPERT_PARTS = {"gate_proj": ("w13", 0), "up_proj": ("w13", 1), "down_proj": ("w2", None)}


def expert_param_name(name: str) -> tuple[str, tuple[int, int | None]] | None:
    """`...experts.{e}.gate_proj.weight` -> (`...experts.w13`, (e, 0)); up -> shard 1; down ->
    (`...experts.w2`, (e, None)). None for any other name."""
    match = EXPERT_NAME.match(name)
    if match is None:
        return None
    prefix, expert, proj = match.groups()
    param, part = EXPERT_PARTS[proj]
    return f"{prefix}.{param}", (int(expert), part)


def expert_checkpoint_names(param_name: str, num_experts: int) -> list[str]:
    """`...experts.w13` -> every expert's gate_proj and up_proj names (w2: down_proj)."""
    prefix, _, param = param_name.rpartition(".")
    projs = [p for p, (target, _) in EXPERT_PARTS.items() if target == param]
    return [f"{prefix}.{e}.{p}.weight" for e in range(num_experts) for p in projs]


class FusedExperts(nn.Module):
    """E routed experts stacked into w13 / w2 (see the module docstring), run by ops.fused_moe.

    Over a tensor-parallel group of `tp` ranks (None: one rank), two layouts:

        tensor parallel (default)  every expert on every rank, its intermediate dim split:
                                   w13 [E, 2I/tp, hidden] = | gate rows of rank r | up rows of r |,
                                   w2 [E, hidden, I/tp] = columns of rank r
        expert_parallel            E/tp whole experts per rank (rank r: experts
                                   [r*E/tp, (r+1)*E/tp)); a rank computes only the (token,
                                   expert) pairs routed to its experts

    Either way the output is this rank's partial sum: the MoE layer all-reduces it."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 ops: LayerOps | None = None, params_dtype: torch.dtype | None = None,
                 tp: GroupCoordinator | None = None, expert_parallel: bool = False):
        super().__init__()
        self.tp = tp or GroupCoordinator.single()
        self.expert_parallel = expert_parallel and self.tp.world_size > 1
        self.num_experts, self.intermediate_size = num_experts, intermediate_size
        e, i = num_experts, intermediate_size
        if self.expert_parallel:
            e = divide(num_experts, self.tp.world_size, "n_routed_experts")
        else:
            i = divide(intermediate_size, self.tp.world_size, "moe_intermediate_size")
        self.num_local_experts, self.intermediate_per_rank = e, i
        self.expert_start = self.tp.rank_in_group * e if self.expert_parallel else 0
        h = hidden_size
        self.w13 = nn.Parameter(torch.empty(e, 2 * i, h, dtype=params_dtype), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(e, h, i, dtype=params_dtype), requires_grad=False)
        self.w13.weight_loader = self.weight_loader
        self.w2.weight_loader = self.weight_loader
        # 8-bit experts (lab/quant, experts: quantize): fp32 [E, 2I] / [E, hidden] channel scales
        self.w13_scale: torch.Tensor | None = None
        self.w2_scale: torch.Tensor | None = None
        self.ops = ops or TorchOps()

    @property
    def shards_intermediate(self) -> bool:
        """True when each expert's intermediate dim is split over ranks (w2's rows span it)."""
        return self.tp.world_size > 1 and not self.expert_parallel

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard: tuple[int, int | None]) -> None:
        """Copy this rank's part of one expert's unsharded tensor: w13 shard 0 = gate rows,
        1 = up rows (this rank's slice of each), w2 this rank's columns; an expert another rank
        holds (expert_parallel) is skipped."""
        expert, part = shard
        i, full_i = self.intermediate_per_rank, self.intermediate_size
        hidden = self.w13.shape[-1]
        full_dim = 0 if part is not None else 1  # gate / up [I, hidden]; down [hidden, I]
        full = (full_i, hidden) if full_dim == 0 else (hidden, full_i)
        if tuple(loaded.shape) != full:
            raise ValueError(f"expected shape {full}, found {tuple(loaded.shape)}")
        local = expert - self.expert_start
        if not 0 <= local < self.num_local_experts:
            return
        r = self.tp.rank_in_group if self.shards_intermediate else 0
        dst = param.data[local]
        if part is not None:
            dst = dst.narrow(0, part * i, i)
        default_weight_loader(dst, loaded.narrow(full_dim, r * i, i))

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor) -> torch.Tensor:
        if self.expert_parallel:
            return self._forward_local_experts(x, topk_weights, topk_ids)
        return self.ops.fused_moe(x, self.w13, self.w2, topk_weights, topk_ids,
                                  self.w13_scale, self.w2_scale)

    def _forward_local_experts(self, x: torch.Tensor, topk_weights: torch.Tensor,
                               topk_ids: torch.Tensor) -> torch.Tensor:
        """Expert parallel: the pairs routed to this rank's experts, each as a top-1 row of
        fused_moe (x gathered per pair), summed back per token; zeros for the other tokens."""
        local = topk_ids - self.expert_start
        mine = (local >= 0) & (local < self.num_local_experts)
        tokens, slots = mine.nonzero(as_tuple=True)
        out = torch.zeros(x.shape, dtype=torch.promote_types(x.dtype, topk_weights.dtype),
                          device=x.device)
        if tokens.numel():
            y = self.ops.fused_moe(x[tokens], self.w13, self.w2,
                                   topk_weights[tokens, slots, None], local[tokens, slots, None],
                                   self.w13_scale, self.w2_scale)
            out.index_add_(0, tokens, y.to(out.dtype))
        return out.to(x.dtype)

    def extra_repr(self) -> str:
        layout = (f", experts {self.expert_start}..+{self.num_local_experts}"
                  if self.expert_parallel else f", intermediate per rank={self.intermediate_per_rank}")
        return (f"experts={self.num_experts}, intermediate={self.intermediate_size}{layout}, "
                f"ops={self.ops.name}")


class MoE(nn.Module):
    """Router + routed experts (+ shared experts), HF's `mlp` of a MoE layer:
    experts(x, gate(x)) + shared_experts(x), all-reduced once over `tp` (both are partial sums
    per rank: the shared experts' down projection is built with reduce_results=False). The
    router is replicated: every rank routes every token the same way."""

    def __init__(self, gate: nn.Module, experts: FusedExperts, shared_experts: nn.Module | None,
                 tp: GroupCoordinator | None = None):
        super().__init__()
        self.gate = gate
        self.experts = experts
        self.shared_experts = shared_experts
        self.tp = tp or GroupCoordinator.single()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        topk_weights, topk_ids = self.gate(x)
        out = self.experts(x, topk_weights, topk_ids)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return self.tp.all_reduce(out)
