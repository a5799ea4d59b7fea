"""The `quant` config group: how a model's linear layers store and multiply their weights.

Two bases (config group = package = base class):

    QuantConfig   the group's option (`lab/conf/quant/*.yaml` -> `_target_: lab.quant.<file>.<Config>`):
                  built once per run, it decides for every linear layer of the model which
                  QuantMethod it holds (`method_for`), refusing what it cannot handle
    QuantMethod   per-layer strategy held by `Linear.quant_method`: `create_weights` registers the
                  parameters, the checkpoint loader fills them, `process_weights_after_loading`
                  turns them into the run-time form, `apply(layer, x)` is the forward

Flow (lab/models/loader.py `load_model`):

    model = cls(hf_config, backend, ops, tp)      # every Linear starts unquantized
    quant = quant.bind(hf_config, ops)            # a copy: the kernels + the checkpoint's check
    quant.quantize_model(model)                   # Linear.set_quant_method(method_for(name, layer));
                                                  # dense layers: UnquantizedLinearMethod(ops)
    model.load_weights(...)                       # params (and per-shard scales) filled
    method.process_weights_after_loading(layer)   # online methods quantize here

Scope shared by every method: embeddings, lm_head, norms and MoE routers stay in the model
dtype (they are not `Linear`s); a model names the linears that must stay dense in
`dense_linears` (DeepSeek: `kv_b_proj`, read as dense per-head views by MLA). Stacked MoE experts
(`FusedExperts`) follow `experts`: `quantize` stores them as 8-bit weights with one scale per
expert and output channel (the method's weight dtype: int8 or fp8; activations stay in the model
dtype; the fused MoE kernel dequantizes in registers) where the method has an expert quantizer,
`refuse` raises, `dense` keeps them in the model dtype and logs it.

Tensor parallelism: a method creates and quantizes this rank's shard of each weight. A scale
whose span crosses ranks (a row-parallel layer's per-channel rows, any per-tensor scale of a
sharded layer, tensor-parallel experts' w2 rows) takes its amax all-reduced (max) over the TP
group (`weight_amax`), so every scale equals the unsharded model's; fp8 checkpoint scales are
sliced with their rows (lab/quant/fp8.py `load_shard_scale`).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from lab.layers.linear import Linear, UnquantizedLinearMethod
from lab.layers.ops import LayerOps, TorchOps

log = logging.getLogger(__name__)

EXPERT_POLICIES = ("refuse", "dense", "quantize")


class QuantMethod:
    """Base of per-layer quantization methods (see the module docstring)."""

    def create_weights(
        self, layer: nn.Module, input_size: int, output_sizes: Sequence[int], bias: bool,
        params_dtype: torch.dtype,
    ) -> None:
        """Register the layer's parameters (shapes before loading) at this rank's sizes: the
        input columns it multiplies and its rows of each fused shard (one entry for a plain
        Linear); a tensor-parallel layer's loader fills them from the unsharded checkpoint."""
        raise NotImplementedError

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Turn the loaded parameters into their run-time form (e.g. quantize them)."""

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The layer's forward: x [..., in] -> [..., out] in x's dtype."""
        raise NotImplementedError


class OnlineQuantMethod(QuantMethod):
    """A method that loads a dense checkpoint and quantizes each weight at load time.

    Subclasses implement `quantize(weight, layer) -> {name: tensor}` (registered as parameters in
    place of `weight`) and `matmul(layer, x2d) -> y2d`. Under tensor parallelism `weight` is this
    rank's shard; a scale whose span crosses ranks takes its amax from `weight_amax`, so it
    equals the unsharded layer's."""

    def __init__(self, ops: LayerOps) -> None:
        self.ops = ops

    def create_weights(self, layer, input_size, output_sizes, bias, params_dtype) -> None:
        UnquantizedLinearMethod().create_weights(layer, input_size, output_sizes, bias, params_dtype)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        weight = layer.weight.data
        del layer.weight
        for name, tensor in self.quantize(weight, layer).items():
            layer.register_parameter(name, nn.Parameter(tensor, requires_grad=False))

    def quantize(self, weight: torch.Tensor, layer: nn.Module) -> dict[str, torch.Tensor]:
        """The dense weight [out, in] (this rank's) -> the tensors that replace it."""
        raise NotImplementedError

    def matmul(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """x [M, in] -> [M, out] in x's dtype, bias included."""
        raise NotImplementedError

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = self.matmul(layer, x.reshape(-1, x.shape[-1]))
        return y.reshape(*lead, y.shape[-1])


class QuantConfig:
    """Base of the `quant` group: hands a QuantMethod to each linear layer of a model."""

    name = "base"

    def __init__(self, experts: str = "refuse") -> None:
        if experts not in EXPERT_POLICIES:
            raise ValueError(f"quant.experts={experts!r}: use one of {', '.join(EXPERT_POLICIES)}")
        self.experts = experts
        self.ops: LayerOps = TorchOps()

    # ---- hooks for subclasses ------------------------------------------------------------
    def method_for(self, prefix: str, layer: Linear) -> QuantMethod | None:
        """The method for the linear named `prefix` (None: keep it unquantized). Raise a
        ValueError naming the layer when the method cannot handle it."""
        raise NotImplementedError

    def expert_quantizer(self, prefix: str):
        """W [N, K] -> (8-bit q [N, K], fp32 scale [N]) for MoE experts (`experts: quantize`), or
        None when the method has no expert path."""
        return None

    def check_checkpoint(self, quant_cfg: dict | None) -> dict[str, Any]:
        """Accept or refuse the checkpoint's `quantization_config` (None: a dense checkpoint);
        returns the attributes `bind` sets on its bound copy (what the checkpoint says)."""
        if quant_cfg is not None:
            method = quant_cfg.get("quant_method", "?")
            raise ValueError(
                f"the checkpoint is quantized (quantization_config.quant_method={method!r}); "
                f"quant={self.name} loads dense checkpoints only (an fp8 checkpoint: quant=fp8)")
        return {}

    # ---- the mechanism -------------------------------------------------------------------
    def bind(self, hf_config, ops: LayerOps) -> QuantConfig:
        """A copy of this config for one model: the run's kernels and what the checkpoint's
        quantization_config says (checked here). This config itself is left unchanged, so one
        `quant` option can be bound to several models."""
        quant_cfg = getattr(hf_config, "quantization_config", None)
        if quant_cfg is not None and not isinstance(quant_cfg, dict):
            quant_cfg = quant_cfg.to_dict()
        bound = copy.copy(self)
        for name, value in {"ops": ops, **self.check_checkpoint(quant_cfg)}.items():
            setattr(bound, name, value)
        return bound

    def quantize_model(self, model: nn.Module) -> None:
        """Give every Linear of `model` its method; refuse or keep MoE experts (see `experts`)."""
        dense = tuple(getattr(model, "dense_linears", ()))
        counts: dict[str, int] = {}
        for prefix, module in model.named_modules():
            if is_fused_experts(module):
                key = self._set_experts(prefix, module)
                counts[key] = counts.get(key, 0) + 1
            if not isinstance(module, Linear):
                continue
            method = None if prefix.rsplit(".", 1)[-1] in dense else self.method_for(prefix, module)
            if method is not None:
                module.set_quant_method(method)
            key = type(method).__name__ if method is not None else "dense"
            counts[key] = counts.get(key, 0) + 1
        bind_dense_methods(model, self.ops)
        log.info("quant=%s: %s", self.name, ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))

    def _set_experts(self, prefix: str, module: nn.Module) -> str:
        """Apply the `experts` policy to one FusedExperts; returns what was done (for the log)."""
        quantizer = self.expert_quantizer(prefix) if self.experts == "quantize" else None
        if self.experts == "dense":
            return "experts kept dense"
        if quantizer is None:
            raise ValueError(
                f"quant={self.name} cannot quantize the MoE experts at {prefix} "
                f"(quant.experts={self.experts}; the fused MoE kernel takes 8-bit int8/fp8 "
                f"expert weights only); set quant.experts=dense to keep the routed experts in "
                f"the model dtype and quantize the other linears")
        module.quant_method = ExpertWeightMethod(quantizer)
        return "experts quantized (8-bit weights)"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(experts={self.experts})"


def bind_dense_methods(model: nn.Module, ops: LayerOps) -> None:
    """Give every layer that holds the default UnquantizedLinearMethod (the dense linears, the
    LM head) one bound to the run's kernels option, which packs its weight after loading where
    it has a kernel for it (`LayerOps.pack_linear`)."""
    for module in model.modules():
        if type(getattr(module, "quant_method", None)) is UnquantizedLinearMethod:
            module.quant_method = UnquantizedLinearMethod(ops)


def abs_amax(t: torch.Tensor, per_row: bool) -> torch.Tensor:
    """max |t| in fp32: of each row [M, 1], or of the whole tensor [1] (0 where empty)."""
    a = t.detach().float().abs()
    if per_row:
        return a.amax(dim=-1, keepdim=True) if a.shape[-1] else a.new_zeros(a.shape[0], 1)
    return (a.amax() if a.numel() else a.new_zeros(())).reshape(1)


def weight_amax(layer: nn.Module, weight: torch.Tensor, per_channel: bool) -> torch.Tensor:
    """The amax a weight scale of `layer` spans, the unsharded layer's on every rank: per
    channel the row maxima [N, 1], per tensor one value [1], in fp32. A row spans ranks when
    the layer splits its input columns (row-parallel); the tensor, when it splits anything; such
    an amax is all-reduced (max) over the layer's TP group (`shards_input` / `shards_output`)."""
    amax = abs_amax(weight, per_channel)
    tp = getattr(layer, "tp", None)
    spans = getattr(layer, "shards_input", False) or (
        not per_channel and getattr(layer, "shards_output", False))
    if spans and tp is not None and tp.world_size > 1:
        tp.all_reduce(amax, op="max")
    return amax


def activation_amax(layer: nn.Module, x: torch.Tensor, per_token: bool) -> torch.Tensor | None:
    """For a layer whose input is split over ranks (row-parallel under TP): the amax of the
    whole activation, per token [M, 1] or per tensor [1], all-reduced (max) over the layer's TP
    group, so the dynamic activation scales equal the unsharded layer's and each rank's int8 /
    fp8 values are the unsharded ones' columns. None for every other layer: the quantize op
    computes its own amax (one collective of M floats is what exactness costs here)."""
    tp = getattr(layer, "tp", None)
    if not getattr(layer, "shards_input", False) or tp is None or tp.world_size == 1:
        return None
    return tp.all_reduce(abs_amax(x, per_token), op="max")


class ExpertWeightMethod:
    """Quantizes a FusedExperts' loaded w13 / w2 per expert and output channel (weights only).

    `quantizer(w [N, K], amax [N, 1] | None) -> (q, scale [N])`. Tensor-parallel experts: w13's
    rows are whole (scales as unsharded); w2's rows span the split intermediate dim, so their
    amax is all-reduced over the group: each rank's scales equal the unsharded ones."""

    def __init__(self, quantizer) -> None:
        self.quantizer = quantizer

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        for name in ("w13", "w2"):
            w = getattr(layer, name)
            e, n, k = w.shape
            flat = w.detach().reshape(e * n, k)
            amax = None
            if name == "w2" and getattr(layer, "shards_intermediate", False):
                amax = layer.tp.all_reduce(flat.float().abs().amax(-1, keepdim=True), op="max")
            q, scale = self.quantizer(flat, amax)
            setattr(layer, name, nn.Parameter(q.reshape(e, n, k), requires_grad=False))
            setattr(layer, f"{name}_scale", scale.reshape(e, n).float().contiguous())


def is_fused_experts(module: nn.Module) -> bool:
    """True for stacked MoE experts (lab.layers.moe.FusedExperts)."""
    from lab.layers.moe import FusedExperts

    return isinstance(module, FusedExperts)


def check_group_size(prefix: str, input_size: int, group_size: int, tp_size: int = 1) -> None:
    """ValueError naming the layer when its input size (this rank's columns: a row-parallel
    layer splits K over `tp_size` ranks) is not a multiple of the group size."""
    if input_size % group_size:
        per_rank = (f" per rank (a row-parallel layer at tensor_parallel_size={tp_size} splits "
                    "its input columns)") if tp_size > 1 else ""
        raise ValueError(
            f"{prefix}: input size {input_size}{per_rank} is not a multiple of quant.group_size="
            f"{group_size} (choose a group size that divides every linear's input size)")


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters (each storage once; tied embeddings counted once)."""
    seen: set[int] = set()
    total = 0
    for param in model.parameters():
        ptr = param.untyped_storage().data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        total += param.untyped_storage().nbytes()
    return total
