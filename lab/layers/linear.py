"""Linear layers, replicated or tensor-parallel (vLLM's semantics), plain or fused (q/k/v, gate/up).

Every linear holds a `quant_method` that creates its weights and computes its forward; the layer
never branches on which method it holds. The default is `UnquantizedLinearMethod`
(weight [out, in] in the model dtype, forward = F.linear, or the GEMM the kernels option packed
the weight for after loading: `LayerOps.pack_linear`). A quantization method only has to
provide the same three methods (`create_weights`, `apply`, `process_weights_after_loading`);
it is given this rank's sizes (`input_size_per_partition`, `output_partition_sizes`).

Fused layout of a merged weight (rows = output features):

    rows:  0 ........ s0 ........ s0+s1 ........ s0+s1+s2
           | shard 0  | shard 1     | shard 2      |        (qkv: | q | k | v |, gate_up: | gate | up |)

Tensor parallelism over a group of `tp` ranks (`tp=None`: a group of one, the same code). The
checkpoint holds the unsharded HF tensors; each weight loader narrows them to this rank's part:

    Linear (= ReplicatedLinear)  every rank holds W [out, in] whole
    ColumnParallelLinear         W's rows split: rank r holds rows [r*out/tp, (r+1)*out/tp) and
                                 outputs that slice of y (no communication)
    MergedColumnParallelLinear   each fused shard's rows split; rank r's weight is the fused
                                 layout of its slices:  | gate_r | up_r |
    QKVParallelLinear            q heads split; kv heads split, or replicated when tp > kv heads
                                 (rank r holds kv head r // (tp / kv heads)):  | q_r | k_r | v_r |
    RowParallelLinear            W's columns split: rank r holds W[:, r*in/tp : (r+1)*in/tp],
                                 takes that slice of x (the column-parallel output before it)
                                 and the partial sums are all-reduced; the bias lives on rank 0
                                 only (zeros elsewhere), so it is added once

    attention / MLP:  x --[Column / QKV: heads of rank r]--> local heads --[Row]--> all-reduce --> y

Example, gate_up [2I, H] and down [H, I] at tp=2 (I' = I/2):

    checkpoint gate [I, H], up [I, H]        rank 0 gate_up [2I', H]      rank 1 gate_up [2I', H]
                                             | gate[0:I']  | up[0:I']  |  | gate[I':I] | up[I':I] |
    checkpoint down [H, I]                   rank 0 down [H, I'] = down[:, 0:I'],  rank 1 [:, I':I]

The weight loaders tell the dimensions apart by their number: a 2-D parameter is [out, in], a
1-D one [out] (bias; per-channel scales come with their own loaders).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lab.attention.spec import kv_heads_per_rank
from lab.distributed.parallel_state import GroupCoordinator
from lab.layers.ops import LayerOps


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Copy a checkpoint tensor into a parameter of the same shape (ValueError otherwise)."""
    if tuple(param.shape) != tuple(loaded.shape):
        raise ValueError(f"expected shape {tuple(param.shape)}, found {tuple(loaded.shape)}")
    with torch.no_grad():
        param.copy_(loaded)


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 kernel: Any = None, packed: torch.Tensor | None = None) -> torch.Tensor:
    """y = x W^T + b: through `kernel.gemm(x, packed, weight, bias)` where the kernels option
    packed the weight for one (`LayerOps.pack_linear`; e.g. kernels=cpu's C++ GEMMs, opaque ops
    under torch.compile), else F.linear."""
    if kernel is not None:
        return kernel.gemm(x, packed, weight, bias)
    return F.linear(x, weight, bias)


class UnquantizedLinearMethod:
    """The default linear method: a dense weight [out, in] (and optional bias), y = x W^T + b.

    `ops`: the run's kernels option, which may pack the loaded weight for a kernel of its own
    (`LayerOps.pack_linear`); None (a layer built outside a model load) is F.linear. The quant
    config hands every dense layer a method bound to the run's ops (lab/quant/base.py)."""

    def __init__(self, ops: LayerOps | None = None) -> None:
        self.ops = ops

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
        return dense_linear(x, layer.weight, layer.bias, getattr(layer, "kernel", None),
                            getattr(layer, "kernel_weight", None))

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Let the kernels option pack the weight (`layer.kernel`, `layer.kernel_weight`; both
        None: F.linear). The dense weight is kept: later passes (e.g. MLA absorption) read it."""
        packer = self.ops.pack_linear if self.ops is not None else (lambda w: (None, None))
        layer.kernel, layer.kernel_weight = packer(layer.weight)


def divide(numerator: int, tp_size: int, what: str) -> int:
    """numerator / tp_size; ValueError naming `what` when it does not divide."""
    if numerator % tp_size:
        raise ValueError(f"{what}={numerator} is not divisible by tensor_parallel_size={tp_size}")
    return numerator // tp_size


class Linear(nn.Module):
    """y = x W^T + b with W [output_size, input_size], replicated on every rank (the base of the
    parallel linears: they override the partition hooks below); the math is the quant_method's.

    `tp`: the tensor-parallel group (None: a group of one)."""

    #: whether this layer splits its input columns / its output rows across the TP group
    #: (a quant method whose scale spans a split dimension reduces its amax over `tp`)
    shards_input = False
    shards_output = False

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        params_dtype: torch.dtype | None = None,
        quant_method: object | None = None,
        tp: GroupCoordinator | None = None,
    ) -> None:
        super().__init__()
        self.tp = tp or GroupCoordinator.single()
        self.tp_size, self.tp_rank = self.tp.world_size, self.tp.rank_in_group
        self.input_size = input_size
        self.output_sizes = self._output_sizes(output_size)  # unsharded, per fused shard
        self.output_size = sum(self.output_sizes)
        self.input_size_per_partition = self._input_partition()
        self.output_partition_sizes = self._output_partitions()  # this rank's, per fused shard
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
        quant_method.create_weights(self, self.input_size_per_partition,
                                    self.output_partition_sizes, self.has_bias, self.params_dtype)
        for param in self.parameters(recurse=False):
            if not hasattr(param, "weight_loader"):
                param.weight_loader = self.weight_loader

    # -- partition hooks (replicated here) ----------------------------------------------------
    def _output_sizes(self, output_size: int) -> list[int]:
        return [output_size]

    def _input_partition(self) -> int:
        return self.input_size

    def _output_partitions(self) -> list[int]:
        return list(self.output_sizes)

    def shard_index(self, shard_id: int | str) -> int:
        """The position of a fused shard in the layout."""
        return int(shard_id)

    def shard_rows(self, idx: int) -> tuple[int, int, int]:
        """(first row in this rank's parameter, first row of the checkpoint's shard tensor, rows)
        of fused shard `idx`: the rows this rank holds."""
        return sum(self.output_partition_sizes[:idx]), 0, self.output_partition_sizes[idx]

    def input_columns(self) -> tuple[int, int]:
        """(first column, columns) of the unsharded input that this rank's weight multiplies."""
        return 0, self.input_size

    # -- loading -------------------------------------------------------------------------------
    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int | str | None = None
    ) -> None:
        """Fill this rank's part of `param` from an unsharded checkpoint tensor: fused shard
        `shard_id`, or (None) the whole layer (a fused one is split into its shards)."""
        shards = range(len(self.output_sizes)) if shard_id is None else [self.shard_index(shard_id)]
        rows = sum(self.output_sizes[i] for i in shards)
        full = (rows, self.input_size) if param.dim() == 2 else (rows,)
        if tuple(loaded.shape) != full:
            raise ValueError(f"expected shape {full}, found {tuple(loaded.shape)}")
        if param.dim() == 2:
            loaded = loaded.narrow(1, *self.input_columns())
        offset = 0
        for idx in shards:
            p0, l0, n = self.shard_rows(idx)
            default_weight_loader(param.data.narrow(0, p0, n), loaded.narrow(0, offset + l0, n))
            offset += self.output_sizes[idx]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x)

    def extra_repr(self) -> str:
        method = type(self.quant_method).__name__
        tp = f", tp={self.tp_size}" if self.tp_size > 1 else ""
        return (f"in={self.input_size_per_partition}, out={self.output_partition_sizes}, "
                f"bias={self.has_bias}{tp}, {method}")


ReplicatedLinear = Linear


class ColumnParallelLinear(Linear):
    """Output rows split across the TP group; y is this rank's slice (all of it with
    `gather_output`, gathered over the group)."""

    shards_output = True

    def __init__(
        self, input_size: int, output_size: int, bias: bool = False,
        params_dtype: torch.dtype | None = None, quant_method: object | None = None,
        tp: GroupCoordinator | None = None, gather_output: bool = False,
    ) -> None:
        self.gather_output = gather_output
        super().__init__(input_size, output_size, bias, params_dtype, quant_method, tp)

    def _output_partitions(self) -> list[int]:
        return [divide(s, self.tp_size, "output_size") for s in self.output_sizes]

    def shard_rows(self, idx: int) -> tuple[int, int, int]:
        n = self.output_partition_sizes[idx]
        return sum(self.output_partition_sizes[:idx]), self.tp_rank * n, n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.quant_method.apply(self, x)
        return self.tp.all_gather(y, dim=-1) if self.gather_output else y


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel linears over the same input stored as one weight; shard k fills
    its rows (this rank's slice of each, placed at the shard's per-rank offset)."""

    def __init__(
        self, input_size: int, output_sizes: Sequence[int], bias: bool = False,
        params_dtype: torch.dtype | None = None, quant_method: object | None = None,
        tp: GroupCoordinator | None = None,
    ) -> None:
        self._sizes = list(output_sizes)
        super().__init__(input_size, sum(output_sizes), bias, params_dtype, quant_method, tp)

    def _output_sizes(self, output_size: int) -> list[int]:
        return self._sizes


MergedLinear = MergedColumnParallelLinear


class QKVParallelLinear(MergedColumnParallelLinear):
    """The fused q/k/v projection: rows | q (H*D) | k (Hkv*D) | v (Hkv*D) |; shard ids "q","k","v".

    Per rank: H/tp query heads; Hkv/tp kv heads, or one replicated kv head when tp > Hkv (rank
    r holds head r // (tp / Hkv)). `num_heads` / `num_kv_heads` are this rank's counts."""

    SHARDS = ("q", "k", "v")

    def __init__(
        self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
        bias: bool = False, params_dtype: torch.dtype | None = None,
        quant_method: object | None = None, tp: GroupCoordinator | None = None,
    ) -> None:
        tp_size = (tp or GroupCoordinator.single()).world_size
        self.head_dim = head_dim
        self.total_num_heads, self.total_num_kv_heads = num_heads, num_kv_heads
        self.num_heads = divide(num_heads, tp_size, "num_attention_heads")
        self.num_kv_heads, self.kv_replicas = kv_heads_per_rank(num_kv_heads, tp_size)
        sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
        super().__init__(hidden_size, sizes, bias, params_dtype, quant_method, tp)

    def _output_partitions(self) -> list[int]:
        kv = self.num_kv_heads * self.head_dim
        return [self.num_heads * self.head_dim, kv, kv]

    def shard_index(self, shard_id: int | str) -> int:
        return self.SHARDS.index(shard_id) if isinstance(shard_id, str) else int(shard_id)

    def shard_rows(self, idx: int) -> tuple[int, int, int]:
        p0, _, n = super().shard_rows(idx)
        rank = self.tp_rank if idx == 0 else self.tp_rank // self.kv_replicas
        return p0, rank * n, n

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Split the fused output [T, q+k+v] into q [T, H, D], k [T, Hkv, D], v [T, Hkv, D]
        (this rank's heads)."""
        q, k, v = qkv.split(self.output_partition_sizes, dim=-1)
        d = self.head_dim
        return (
            q.reshape(-1, self.num_heads, d),
            k.reshape(-1, self.num_kv_heads, d),
            v.reshape(-1, self.num_kv_heads, d),
        )


QKVLinear = QKVParallelLinear


class RowParallelLinear(Linear):
    """Input columns split across the TP group; the partial products are all-reduced
    (`reduce_results=False` leaves that to the caller, e.g. a MoE layer reducing routed and
    shared experts at once). The bias is held by rank 0 only (zeros elsewhere).

    `input_is_parallel`: x is already this rank's slice (a column-parallel output); otherwise
    the layer takes its slice of a whole x."""

    shards_input = True

    def __init__(
        self, input_size: int, output_size: int, bias: bool = False,
        params_dtype: torch.dtype | None = None, quant_method: object | None = None,
        tp: GroupCoordinator | None = None, reduce_results: bool = True,
        input_is_parallel: bool = True,
    ) -> None:
        self.reduce_results, self.input_is_parallel = reduce_results, input_is_parallel
        super().__init__(input_size, output_size, bias, params_dtype, quant_method, tp)

    def _input_partition(self) -> int:
        return divide(self.input_size, self.tp_size, "input_size")

    def input_columns(self) -> tuple[int, int]:
        n = self.input_size_per_partition
        return self.tp_rank * n, n

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int | str | None = None
    ) -> None:
        """As Linear's (W's columns narrowed to this rank's); a 1-D parameter (the bias) is
        loaded on rank 0 and zeroed on the others."""
        super().weight_loader(param, loaded, shard_id)
        if param.dim() == 1 and self.tp_rank != 0:
            with torch.no_grad():
                param.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = x.narrow(-1, *self.input_columns())
        y = self.quant_method.apply(self, x)
        return self.tp.all_reduce(y) if self.reduce_results else y
