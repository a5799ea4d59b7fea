"""Linear layers: a plain Linear and fused (merged) linears for q/k/v and gate/up.

Every linear holds a `quant_method` that creates its weights and computes its forward; the layer
never branches on which method it holds. The default is `UnquantizedLinearMethod`
(weight [out, in] in the model dtype, forward = F.linear). A quantization method only has to
provide the same three methods (`create_weights`, `apply`, `process_weights_after_loading`).

Fused layout of a merged weight (rows = output features):

    rows:  0 ........ s0 ........ s0+s1 ........ s0+s1+s2
           | shard 0  | shard 1     | shard 2      |        (qkv: | q | k | v |, gate_up: | gate | up |)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Copy a checkpoint tensor into a parameter of the same shape (ValueError otherwise)."""
    if tuple(param.shape) != tuple(loaded.shape):
        raise ValueError(f"expected shape {tuple(param.shape)}, found {tuple(loaded.shape)}")
    with torch.no_grad():
        param.copy_(loaded)


def onednn_pack(weight: torch.Tensor) -> torch.Tensor | None:
    """A oneDNN-prepacked copy of a CPU fp32/bf16 weight [out, in], or None where unavailable.

    At decode batch sizes a prepacked GEMM is up to ~3x faster than F.linear's MKL sgemm on CPU
    (the same trick vLLM's CPU backend and inductor's freezing use), but each call costs a fixed
    ~40 us, so a small weight (below _MIN_PACK_ELEMENTS) stays with F.linear: 64x128 at batch 3
    takes 6 us there against 52 us packed, while 1024x3072 takes 0.7 ms packed against 1.8 ms
    (one thread, 2-vCPU EPYC without AVX-512, torch 2.13). The dense weight is kept: later passes
    (e.g. MLA absorption) read it.
    """
    if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16):
        return None
    if weight.numel() < _MIN_PACK_ELEMENTS:
        return None
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACK_BATCH_HINT)
    except (RuntimeError, AttributeError):
        return None


_PACK_BATCH_HINT = 16
_MIN_PACK_ELEMENTS = 1 << 18  # 512 x 512: below it the packed call's fixed cost dominates


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 packed: torch.Tensor | None) -> torch.Tensor:
    """y = x W^T + b, through the prepacked weight when there is one."""
    if packed is not None:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return F.linear(x, weight, bias)


class UnquantizedLinearMethod:
    """The default linear method: a dense weight [out, in] (and optional bias), y = x W^T + b."""

    def create_weights(
        self, layer: nn.Module, input_size: int, output_sizes: Sequence[int], bias: bool,
        params_dtype: torch.dtype | None,
    ) -> None:
        """Register `weight` (and `bias`) on the layer, uninitialised."""
        out = sum(output_sizes)
        layer.weight = nn.Parameter(torch.empty(out, input_size, dtype=params_dtype), requires_grad=False)
        bias_param = None
        if bias:
            bias_param = nn.Parameter(torch.empty(out, dtype=params_dtype), requires_grad=False)
        layer.register_parameter("bias", bias_param)

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The layer's forward."""
        return dense_linear(x, layer.weight, layer.bias, getattr(layer, "packed_weight", None))

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """On CPU, prepack the weight for oneDNN (see `onednn_pack`)."""
        layer.packed_weight = onednn_pack(layer.weight)


class Linear(nn.Module):
    """y = x W^T + b with W [output_size, input_size]; the math is delegated to `quant_method`."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        params_dtype: torch.dtype | None = None,
        quant_method: object | None = None,
    ) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_sizes = self._output_sizes(output_size)
        self.output_size = sum(self.output_sizes)
        self.params_dtype = params_dtype or torch.get_default_dtype()
        self.has_bias = bias
        self.set_quant_method(quant_method or UnquantizedLinearMethod())

    def set_quant_method(self, quant_method: object) -> None:
        """(Re)create this layer's parameters with `quant_method` (before weights are loaded).

        A parameter the method gave its own `weight_loader` (e.g. a per-shard scale) keeps it;
        every other one is filled by the layer's loader (whole tensor or one fused shard)."""
        for name in list(self._parameters):
            delattr(self, name)
        self.quant_method = quant_method
        quant_method.create_weights(
            self, self.input_size, self.output_sizes, self.has_bias, self.params_dtype)
        for param in self.parameters(recurse=False):
            if not hasattr(param, "weight_loader"):
                param.weight_loader = self.weight_loader

    def _output_sizes(self, output_size: int) -> list[int]:
        return [output_size]

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int | str | None = None
    ) -> None:
        """Load a whole (unfused) tensor into `param`."""
        default_weight_loader(param, loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x)

    def extra_repr(self) -> str:
        method = type(self.quant_method).__name__
        return f"in={self.input_size}, out={self.output_sizes}, bias={self.has_bias}, {method}"


class MergedLinear(Linear):
    """Several linears over the same input stored as one weight; shard k fills its rows."""

    def __init__(
        self,
        input_size: int,
        output_sizes: Sequence[int],
        bias: bool = False,
        params_dtype: torch.dtype | None = None,
        quant_method: object | None = None,
    ) -> None:
        self._sizes = list(output_sizes)
        super().__init__(input_size, sum(output_sizes), bias, params_dtype, quant_method)

    def _output_sizes(self, output_size: int) -> list[int]:
        return self._sizes

    def shard_index(self, shard_id: int | str) -> int:
        """The position of a shard in the fused layout."""
        return int(shard_id)

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int | str | None = None
    ) -> None:
        """Fill the rows of shard `shard_id` (None: the checkpoint already holds the fused tensor)."""
        if shard_id is None:
            default_weight_loader(param, loaded)
            return
        idx = self.shard_index(shard_id)
        start = sum(self.output_sizes[:idx])
        default_weight_loader(param.data.narrow(0, start, self.output_sizes[idx]), loaded)


class QKVLinear(MergedLinear):
    """The fused q/k/v projection: rows | q (H*D) | k (Hkv*D) | v (Hkv*D) |; shard ids "q","k","v"."""

    SHARDS = ("q", "k", "v")

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool = False,
        params_dtype: torch.dtype | None = None,
        quant_method: object | None = None,
    ) -> None:
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
        super().__init__(hidden_size, sizes, bias, params_dtype, quant_method)

    def shard_index(self, shard_id: int | str) -> int:
        return self.SHARDS.index(shard_id) if isinstance(shard_id, str) else int(shard_id)

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Split the fused output [T, q+k+v] into q [T, H, D], k [T, Hkv, D], v [T, Hkv, D]."""
        q, k, v = qkv.split(self.output_sizes, dim=-1)
        d = self.head_dim
        return (
            q.reshape(-1, self.num_heads, d),
            k.reshape(-1, self.num_kv_heads, d),
            v.reshape(-1, self.num_kv_heads, d),
        )
