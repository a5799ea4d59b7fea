"""quant=fp8: e4m3 weights and dynamically quantized e4m3 activations (`LayerOps.fp8_gemm`).

    weight  float8_e4m3fn [N, K] with fp32 scales: per output channel [N] (weight_scheme
            per_channel) or one per layer [1] (per_tensor); w ~= q * scale
    act     quantized on the fly: per token [M, 1] (activation_scheme per_token) or per tensor [1]
    y       = (a_q * a_scale) @ (w_q * w_scale)^T + bias

Two sources of weights:
  - a dense checkpoint (fp32/fp16/bf16): quantized at load with `weight_scheme`;
  - an fp8 checkpoint (config.json `quantization_config: {quant_method: fp8, activation_scheme:
    dynamic}`, tensors `<layer>.weight` e4m3 + `<layer>.weight_scale`, per tensor (scalar) or per
    channel ([N] / [N, 1])), loaded as is. The per-shard scales of a fused layer (q/k/v,
    gate/up) are reconciled WITHOUT requantizing: each shard's scale is written to its rows of a
    per-channel scale [N], so the fused layer is bit-exact to its shards. Block-wise scales
    (weight_block_size, DeepSeek-V3's release) and static activation scales (activation_scheme
    static, `input_scale`) are refused. Layers the checkpoint lists in `ignored_layers` /
    `modules_to_not_convert` load dense.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from lab.layers.linear import Linear, UnquantizedLinearMethod
from lab.quant.base import (
    OnlineQuantMethod,
    QuantConfig,
    QuantMethod,
    activation_amax,
    weight_amax,
)

FP8_DTYPE = torch.float8_e4m3fn
WEIGHT_SCHEMES = ("per_channel", "per_tensor")
ACTIVATION_SCHEMES = ("per_token", "per_tensor")


def quantize_fp8_weight(
    weight: torch.Tensor, per_channel: bool, amax: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] -> (e4m3 [N, K], fp32 scale [N] per channel or [1] per tensor); `amax` ([N, 1]
    or one value) replaces W's own (a tensor-parallel shard, lab/quant/base.py weight_amax)."""
    from lab.kernels import quantize

    fn = quantize.quantize_fp8_per_token_ref if per_channel else quantize.quantize_fp8_per_tensor_ref
    q, scale = fn(weight, amax=amax)
    return q.contiguous(), scale.reshape(-1).contiguous()


class Fp8Matmul:
    """The forward shared by online and checkpoint fp8 layers."""

    ops = None
    per_token = True

    def matmul(self, layer, x: torch.Tensor) -> torch.Tensor:
        amax = activation_amax(layer, x, self.per_token)
        if amax is None:
            a_q, a_scale = self.ops.quantize_fp8(x, self.per_token)
        else:  # a row-parallel shard: the whole row's (tensor's) scale (see activation_amax)
            from lab.kernels import quantize

            ref = (quantize.quantize_fp8_per_token_ref if self.per_token
                   else quantize.quantize_fp8_per_tensor_ref)
            a_q, a_scale = ref(x, amax=amax)
        return self.ops.fp8_gemm(a_q, a_scale, layer.weight, layer.weight_scale, layer.bias, x.dtype)


class Fp8OnlineLinearMethod(Fp8Matmul, OnlineQuantMethod):
    """Quantize a dense weight to e4m3 at load."""

    def __init__(self, ops, per_channel: bool, per_token: bool) -> None:
        OnlineQuantMethod.__init__(self, ops)
        self.per_channel, self.per_token = per_channel, per_token

    def quantize(self, weight: torch.Tensor, layer) -> dict[str, torch.Tensor]:
        amax = weight_amax(layer, weight, self.per_channel)
        q, scale = quantize_fp8_weight(weight, self.per_channel, amax)
        return {"weight": q, "weight_scale": scale}


class Fp8CheckpointLinearMethod(Fp8Matmul, OnlineQuantMethod):
    """Load e4m3 weights and their scales from the checkpoint (per-shard scales -> per channel)."""

    def __init__(self, ops, per_token: bool) -> None:
        OnlineQuantMethod.__init__(self, ops)
        self.per_token = per_token

    def create_weights(self, layer, input_size, output_sizes, bias, params_dtype) -> None:
        UnquantizedLinearMethod().create_weights(layer, input_size, output_sizes, bias, params_dtype)
        out = sum(output_sizes)
        layer.weight = nn.Parameter(torch.empty(out, input_size, dtype=FP8_DTYPE), requires_grad=False)
        layer.weight_scale = nn.Parameter(torch.empty(out, dtype=torch.float32), requires_grad=False)
        layer.weight_scale.weight_loader = functools.partial(load_shard_scale, layer)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Nothing to convert: the scales are already per channel."""


def load_shard_scale(layer: Linear, param: nn.Parameter, loaded: torch.Tensor,
                     shard_id: int | str | None = None) -> None:
    """Write a checkpoint scale (scalar / [1] per tensor, [n] / [n, 1] per channel, n the
    unsharded rows) into this rank's rows of shard `shard_id` of the per-channel scale (None:
    the whole layer). Per-channel values follow their rows (a column-parallel rank takes its
    slice, the same rows as its weight's); a scalar fills every row."""
    shards = range(len(layer.output_sizes)) if shard_id is None else [layer.shard_index(shard_id)]
    size = sum(layer.output_sizes[i] for i in shards)
    flat = loaded.reshape(-1).float()
    if flat.numel() not in (1, size):
        raise ValueError(f"weight_scale: expected 1 or {size} values, found shape {tuple(loaded.shape)}")
    offset = 0
    for idx in shards:
        start, first, rows = layer.shard_rows(idx)
        values = flat.expand(rows) if flat.numel() == 1 else flat[offset + first: offset + first + rows]
        with torch.no_grad():
            param.data.narrow(0, start, rows).copy_(values)
        offset += layer.output_sizes[idx]


class Fp8Config(QuantConfig):
    """fp8 W8A8 for every linear; dense checkpoints quantized online, fp8 checkpoints loaded."""

    name = "fp8"

    def __init__(self, weight_scheme: str = "per_channel", activation_scheme: str = "per_token",
                 experts: str = "quantize") -> None:
        super().__init__(experts)
        if weight_scheme not in WEIGHT_SCHEMES:
            raise ValueError(f"quant.weight_scheme={weight_scheme!r}: use {' or '.join(WEIGHT_SCHEMES)}")
        if activation_scheme not in ACTIVATION_SCHEMES:
            raise ValueError(
                f"quant.activation_scheme={activation_scheme!r}: use {' or '.join(ACTIVATION_SCHEMES)}")
        self.weight_scheme, self.activation_scheme = weight_scheme, activation_scheme
        self.serialized = False
        self.ignored: tuple[str, ...] = ()

    def check_checkpoint(self, quant_cfg: dict | None) -> dict[str, Any]:
        if quant_cfg is None:
            return {"serialized": False, "ignored": ()}
        if quant_cfg.get("quant_method") != "fp8":
            super().check_checkpoint(quant_cfg)
        if quant_cfg.get("weight_block_size"):
            raise ValueError("fp8 checkpoint with block-wise scales (weight_block_size="
                             f"{quant_cfg['weight_block_size']}) is not supported")
        if quant_cfg.get("activation_scheme", "dynamic") != "dynamic":
            raise ValueError(f"fp8 checkpoint with activation_scheme="
                             f"{quant_cfg['activation_scheme']!r} is not supported (dynamic only)")
        ignored = quant_cfg.get("ignored_layers") or quant_cfg.get("modules_to_not_convert") or ()
        return {"serialized": True, "ignored": tuple(ignored)}

    def method_for(self, prefix: str, layer: Linear) -> QuantMethod | None:
        per_token = self.activation_scheme == "per_token"
        if not self.serialized:
            return Fp8OnlineLinearMethod(self.ops, self.weight_scheme == "per_channel", per_token)
        if any(prefix == name or prefix.startswith(name + ".") or prefix.endswith("." + name)
               for name in self.ignored):
            return None
        return Fp8CheckpointLinearMethod(self.ops, per_token)

    def expert_quantizer(self, prefix: str):
        if self.serialized:
            raise ValueError(f"{prefix}: MoE experts of an fp8 checkpoint are not supported "
                             "(only dense checkpoints get 8-bit experts with quant=fp8)")
        return lambda w, amax=None: quantize_fp8_weight(w, per_channel=True, amax=amax)

    def __repr__(self) -> str:
        return (f"Fp8Config(weight_scheme={self.weight_scheme}, activation_scheme="
                f"{self.activation_scheme}, experts={self.experts})")
