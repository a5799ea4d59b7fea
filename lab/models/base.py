"""The model seam: what the loader, the worker and the model runner rely on in a model.

A model class is chosen by the checkpoint's HF `architectures` (lab/models/registry.py), built by
the loader as `cls(hf_config, attn_backend, ops, tp, expert_parallel=...)` under the target
device and dtype, then filled by `load_weights`. Each step the model runner calls

    hidden = model(input_ids, positions, kv_caches, attn_metadata)   # [T] -> [T, hidden]
    logits = model.compute_logits(hidden[logits_indices])            # [N, hidden] -> [N, vocab]

on one flat token batch (requests back to back, see lab/attention/base.py), and the worker sizes
the KV cache from `attention_spec` (per layer) times `num_layers`. What the model is from its
config alone lives in its `arch_spec` (lab/models/arch.py, torch-free): `attention_spec(hf_config,
tp_size)` gives the same spec without building the model (what the loader checks against the
backend, and what the simulator counts KV bytes per token from).

Tensor parallelism (`tp`, a GroupCoordinator; None: one rank): every rank of the group builds
the model with the same `tp`, loads the same unsharded checkpoint (each layer keeps its part)
and runs `forward` on the same inputs. The spec is per rank (its heads; its KV cache), and
`compute_logits` is a collective: every rank calls it, the group's rank 0 gets the logits, the
others None.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import ClassVar

import torch
from torch import nn

from lab.attention.base import AttentionBackend
from lab.attention.spec import AttentionSpec
from lab.distributed.parallel_state import GroupCoordinator
from lab.layers.ops import LayerOps, TorchOps
from lab.models.arch import ArchSpec


class CausalLM(nn.Module, ABC):
    """Base class of the model families: a causal LM over a flat batch with paged attention."""

    #: what this model is from its config alone (the spec the architectures table maps to it)
    arch_spec: ClassVar[type[ArchSpec]]
    #: the KV layout every layer of this model shares (heads, head_dim, kind)
    attention_spec: AttentionSpec
    #: each layer's spec: attention_spec plus what the layer asks of attention (its sliding
    #: window, sinks, soft cap); the KV cache groups layers by it (lab/cache/groups.py)
    layer_specs: list[AttentionSpec]
    #: the decoder layers that own a KV cache (one cache tensor each)
    num_layers: int

    def __init__(
        self, hf_config, attn_backend: AttentionBackend, ops: LayerOps | None = None,
        tp: GroupCoordinator | None = None, expert_parallel: bool = False,
    ) -> None:
        """Record the config, the ops (None: TorchOps), the TP group (None: one rank), the
        attention spec of this rank and the layer count; subclasses then build their layers on
        `attn_backend` (already checked by the loader to support `attention_spec`).
        `expert_parallel`: MoE layers hold whole experts per rank instead of splitting each
        expert (no effect on a model without MoE layers or on one rank)."""
        super().__init__()
        self.config = hf_config
        self.ops = ops or TorchOps()
        self.tp = tp or GroupCoordinator.single()
        self.expert_parallel = expert_parallel
        self.attention_spec = self.arch_spec.attention_spec(hf_config, self.tp.world_size)
        self.layer_specs = self.arch_spec.layer_attention_specs(hf_config, self.tp.world_size)
        check_one_kv_layout(self.attention_spec, self.layer_specs)
        self.num_layers = hf_config.num_hidden_layers

    @abstractmethod
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor,
        kv_caches: list[torch.Tensor], attn_metadata: object,
    ) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]. kv_caches: one tensor per
        layer (`num_layers`, shaped by the backend's KVCacheSpec); attn_metadata: what the
        backend's `build_metadata` made for this step."""

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Hidden states [N, hidden] -> float32 logits [N, vocab] on the TP group's rank 0, None
        on the other ranks (a collective: every rank calls it)."""

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named tensors strictly: raise ValueError naming every missing, unexpected and
        mis-shaped tensor. Returns the names of the parameters loaded."""


def check_one_kv_layout(spec: AttentionSpec, layer_specs: list[AttentionSpec]) -> None:
    """Every layer's KV cache must have the model's layout (the KV cache groups share their
    tensors, lab/cache/groups.py): a layer may differ in its features (window, sinks, soft cap),
    not in its KV heads, head_dim or kind. ValueError naming the first layer that does."""
    layout = (spec.num_kv_heads, spec.head_dim, spec.kind)
    for i, layer in enumerate(layer_specs):
        if (layer.num_kv_heads, layer.head_dim, layer.kind) != layout:
            raise ValueError(
                f"layer {i} has KV heads / head_dim / kind {(layer.num_kv_heads, layer.head_dim, layer.kind)} "
                f"but the model's KV cache layout is {layout}: lab's KV cache groups share one "
                "layout (per-layer head sizes are not supported)")
