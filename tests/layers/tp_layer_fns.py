"""Functions run on each rank of a RankPool(2) by test_tp_layers.py (importable by name there).

Each builds a tensor-parallel layer and its unsharded twin (tp=None) from the same seeded random
HF-shaped tensors, loads both through their weight loaders, runs both on the same input and
returns {check: (got, want)}: `got` reassembled from the ranks (all_gather) where the layer's
output is sharded, so every rank can compare against the whole."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from lab.layers.decoder import GatedMLP
from lab.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from lab.layers.linear import (
    ColumnParallelLinear,
    Linear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from lab.layers.moe import FusedExperts, MoE
from lab.layers.ops import TorchOps


def _rand(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _load(layer, tensors: dict) -> None:
    """tensors: {(param name, shard id or None): unsharded tensor} through the params' loaders."""
    for (name, shard), t in tensors.items():
        param = getattr(layer, name)
        param.weight_loader(param, t) if shard is None else param.weight_loader(param, t, shard)


def _finish(layer) -> None:
    layer.quant_method.process_weights_after_loading(layer)


def linears(state) -> dict:
    """Column (sliced and gathered), merged, QKV (split and replicated kv), row (+ bias, input
    sliced or whole), a fused checkpoint tensor, and a column -> row MLP."""
    tp, x = state.tp, _rand(3, 8, seed=0)
    w, b = _rand(12, 8, seed=1), _rand(12, seed=2)
    out = {}
    col = ColumnParallelLinear(8, 12, bias=True, tp=tp)
    _load(col, {("weight", None): w, ("bias", None): b})
    out["column"] = (tp.all_gather(col(x), dim=-1), F.linear(x, w, b))
    gathered = ColumnParallelLinear(8, 12, bias=True, tp=tp, gather_output=True)
    _load(gathered, {("weight", None): w, ("bias", None): b})
    out["column_gather_output"] = (gathered(x), F.linear(x, w, b))

    gate, up = _rand(6, 8, seed=3), _rand(6, 8, seed=4)
    merged = MergedColumnParallelLinear(8, [6, 6], tp=tp)
    _load(merged, {("weight", 1): up, ("weight", 0): gate})
    g, u = merged(x).chunk(2, dim=-1)  # | gate_r | up_r |
    out["merged"] = (torch.cat([tp.all_gather(g), tp.all_gather(u)], -1),
                     torch.cat([x @ gate.T, x @ up.T], -1))
    fused = MergedColumnParallelLinear(8, [6, 6], tp=tp)  # the checkpoint holds | gate | up |
    _load(fused, {("weight", None): torch.cat([gate, up])})
    out["merged_fused_checkpoint"] = (fused.weight.data, merged.weight.data)

    wr, br = _rand(8, 12, seed=5), _rand(8, seed=6)
    xr = _rand(3, 12, seed=7)
    row = RowParallelLinear(12, 8, bias=True, tp=tp)
    _load(row, {("weight", None): wr, ("bias", None): br})
    n = row.input_size_per_partition
    out["row_bias"] = (row(xr[:, tp.rank_in_group * n:][:, :n]), F.linear(xr, wr, br))
    whole = RowParallelLinear(12, 8, bias=True, tp=tp, input_is_parallel=False)
    _load(whole, {("weight", None): wr, ("bias", None): br})
    out["row_whole_input"] = (whole(xr), F.linear(xr, wr, br))
    out["row_bias_on_rank0_only"] = (row.bias.data.abs().sum() > 0,
                                     torch.tensor(tp.rank_in_group == 0))

    mlp, ref = GatedMLP(8, 12, bias=True, tp=tp), GatedMLP(8, 12, bias=True)
    tensors = {("gate_up_proj", "weight", 0): _rand(12, 8, seed=8),
               ("gate_up_proj", "weight", 1): _rand(12, 8, seed=9),
               ("gate_up_proj", "bias", 0): _rand(12, seed=10),
               ("gate_up_proj", "bias", 1): _rand(12, seed=11),
               ("down_proj", "weight", None): _rand(8, 12, seed=12),
               ("down_proj", "bias", None): _rand(8, seed=13)}
    for m in (mlp, ref):
        for (sub, name, shard), t in tensors.items():
            _load(getattr(m, sub), {(name, shard): t})
    out["gated_mlp"] = (mlp(x), ref(x))
    return out


def qkv(state, num_kv_heads: int) -> dict:
    """QKVParallelLinear (4 heads of 2, num_kv_heads) against the unsharded projections: q heads
    of this rank, kv heads of this rank (or the one it replicates)."""
    tp, x = state.tp, _rand(3, 8, seed=20)
    parts = {"q": _rand(8, 8, seed=21), "k": _rand(2 * num_kv_heads, 8, seed=22),
             "v": _rand(2 * num_kv_heads, 8, seed=23)}
    biases = {s: _rand(t.shape[0], seed=24 + i) for i, (s, t) in enumerate(parts.items())}
    layer = QKVParallelLinear(8, 2, 4, num_kv_heads, bias=True, tp=tp)
    for s in "vkq":  # any order
        _load(layer, {("weight", s): parts[s], ("bias", s): biases[s]})
    q, k, v = layer.split(layer(x))
    full = {s: F.linear(x, parts[s], biases[s]).reshape(3, -1, 2) for s in "qkv"}
    r, replicas = tp.rank_in_group, layer.kv_replicas
    kv_first = (r // replicas) * layer.num_kv_heads
    return {
        "q_gathered": (tp.all_gather(q, dim=1), full["q"]),
        "k_mine": (k, full["k"][:, kv_first:kv_first + layer.num_kv_heads]),
        "v_mine": (v, full["v"][:, kv_first:kv_first + layer.num_kv_heads]),
        "heads": (torch.tensor([layer.num_heads, layer.num_kv_heads, replicas]),
                  torch.tensor([4 // tp.world_size, max(1, num_kv_heads // tp.world_size),
                                max(1, tp.world_size // num_kv_heads)])),
    }


def vocab(state, vocab_size: int) -> dict:
    """VocabParallelEmbedding (padded when tp does not divide the vocab), ParallelLMHead
    gathered on rank 0 (None elsewhere), and a head tied to the embedding."""
    tp, hidden = state.tp, 4
    table, head_w = _rand(vocab_size, hidden, seed=30), _rand(vocab_size, hidden, seed=31)
    ids = torch.arange(vocab_size).flip(0)
    emb = VocabParallelEmbedding(vocab_size, hidden, tp=tp)
    _load(emb, {("weight", None): table})
    h = emb(ids)
    head = ParallelLMHead(vocab_size, hidden, tp=tp)
    _load(head, {("weight", None): head_w})
    _finish(head)
    tied = ParallelLMHead(vocab_size, hidden, tp=tp)
    tied.tie(emb)
    _finish(tied)
    logits, tied_logits = head(h), tied(h)
    first = tp.rank_in_group == 0
    out = {"embedding": (h, table[ids]),
           "tied_shares_weight": (torch.tensor(tied.weight is emb.weight), torch.tensor(True)),
           "padding_rows_zero": (emb.weight.data[emb.num_real_rows:].abs().sum(), torch.tensor(0.0)),
           "logits_only_on_rank0": (torch.tensor(logits is None), torch.tensor(not first))}
    if first:
        out["lm_head"] = (logits, h @ head_w.T)
        out["tied_lm_head"] = (tied_logits, h @ table.T)
    return out


def experts(state, expert_parallel: bool, quantize: bool) -> dict:
    """A MoE layer (4 experts of intermediate 8, one shared expert, replicated router stand-in)
    split per expert or expert-parallel, optionally with int8 experts, against the unsharded one."""
    from lab.quant.base import ExpertWeightMethod
    from lab.quant.int8 import quantize_int8_per_channel

    tp, e, h, i = state.tp, 4, 16, 8
    x = _rand(6, h, seed=40)
    topk_ids = torch.stack([torch.arange(6) % e, (torch.arange(6) + 1) % e], 1)
    topk_weights = torch.rand(6, 2, generator=torch.Generator().manual_seed(41))
    layers = []
    for group, ep in ((tp, expert_parallel), (None, False)):
        fused = FusedExperts(e, h, i, TorchOps(), tp=group, expert_parallel=ep)
        for j in range(e):
            fused.w13.weight_loader(fused.w13, _rand(i, h, seed=50 + j), (j, 0))
            fused.w13.weight_loader(fused.w13, _rand(i, h, seed=60 + j), (j, 1))
            fused.w2.weight_loader(fused.w2, _rand(h, i, seed=70 + j), (j, None))
        if quantize:
            ExpertWeightMethod(quantize_int8_per_channel).process_weights_after_loading(fused)
        shared = GatedMLP(h, i, tp=group, reduce_results=False)
        _load(shared.gate_up_proj, {("weight", None): _rand(2 * i, h, seed=80)})
        _load(shared.down_proj, {("weight", None): _rand(h, i, seed=81)})
        moe = MoE(lambda y: (topk_weights, topk_ids), fused, shared, group)
        layers.append((moe, fused))
    (moe, fused), (ref, ref_fused) = layers
    out = {"moe": (moe(x), ref(x))}
    if quantize and not expert_parallel:  # w13 rows: a slice of the unsharded scales; w2: equal
        n = fused.w13_scale.shape[1] // 2
        r = tp.rank_in_group
        want13 = torch.cat([ref_fused.w13_scale[:, :i][:, r * n:(r + 1) * n],
                            ref_fused.w13_scale[:, i:][:, r * n:(r + 1) * n]], 1)
        out["w13_scale"] = (fused.w13_scale, want13)
        out["w2_scale"] = (fused.w2_scale, ref_fused.w2_scale)
    return out


def quantized(state, method: str) -> dict:
    """A merged column layer (gate/up 64 -> 2x64) feeding a row layer (64 -> 64, bias) under
    `method`, TP against tp=None: outputs close, weight scales equal to the unsharded ones'
    (this rank's rows of a column layer)."""
    tp = state.tp
    x = _rand(5, 64, seed=90)
    gate, up, down = _rand(64, 64, seed=91), _rand(64, 64, seed=92) * 3, _rand(64, 64, seed=93)
    down_bias = _rand(64, seed=94)
    results = []
    for group in (tp, None):
        col = MergedColumnParallelLinear(64, [64, 64], tp=group)
        row = RowParallelLinear(64, 64, bias=True, tp=group)
        for layer, tensors in ((col, {0: gate, 1: up}), (row, {None: down})):
            _quantize(layer, method, tensors, down_bias if layer is row else None)
        y_col = col(x)
        g, u = y_col.chunk(2, dim=-1)
        results.append((col, row, F.silu(g) * u, y_col))
    (col, row, act, y_col), (ref_col, ref_row, ref_act, ref_y_col) = results
    r, n = tp.rank_in_group, 32
    out = {"column": (y_col, torch.cat([ref_y_col[:, r * n:(r + 1) * n],
                                        ref_y_col[:, 64 + r * n:64 + (r + 1) * n]], -1)),
           "row": (row(act), ref_row(ref_act))}
    scale = getattr(row, "weight_scale", None)
    if scale is not None and method != "w4a16":
        out["row_scale"] = (row.weight_scale, ref_row.weight_scale)
        if ref_col.weight_scale.numel() > 1:
            ref_scale = ref_col.weight_scale
            out["column_scale"] = (col.weight_scale, torch.cat(
                [ref_scale[r * n:(r + 1) * n], ref_scale[64 + r * n:64 + (r + 1) * n]]))
        else:
            out["column_scale"] = (col.weight_scale, ref_col.weight_scale)
    return out


def _quantize(layer: Linear, method: str, tensors: dict, bias) -> None:
    """Give `layer` the method, load its (sharded) tensors, finish it. fp8_checkpoint: the
    tensors are stored as e4m3 with per-channel scales (column) or one scale (row) first."""
    from lab.quant.fp8 import Fp8Config, quantize_fp8_weight
    from lab.quant.int8 import Int8Config
    from lab.quant.w4a16 import W4A16Config

    configs = {"int8": Int8Config(), "fp8_per_channel": Fp8Config(),
               "fp8_per_tensor": Fp8Config(weight_scheme="per_tensor"),
               "fp8_checkpoint": Fp8Config(), "w4a16": W4A16Config(group_size=32)}
    hf = SimpleNamespace(quantization_config={"quant_method": "fp8", "activation_scheme": "dynamic"}
                         if method == "fp8_checkpoint" else None)
    config = configs[method].bind(hf, TorchOps())
    layer.set_quant_method(config.method_for("layer", layer))
    for shard, t in tensors.items():
        if method == "fp8_checkpoint":
            t, scale = quantize_fp8_weight(t, per_channel=shard is not None)
            _load(layer, {("weight_scale", shard): scale})
        _load(layer, {("weight", shard): t})
    if bias is not None:
        _load(layer, {("bias", None): bias})
    _finish(layer)


def w4a16_refuses_split_groups(state) -> str:
    """A row-parallel layer whose per-rank K (32) is not a multiple of group_size 64."""
    from lab.quant.w4a16 import W4A16Config

    config = W4A16Config(group_size=64).bind(SimpleNamespace(quantization_config=None), TorchOps())
    try:
        config.method_for("model.layers.0.mlp.down_proj", RowParallelLinear(64, 64, tp=state.tp))
    except ValueError as err:
        return str(err)
    return "accepted"
