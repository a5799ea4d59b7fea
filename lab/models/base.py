"""The model seam: what the loader, the worker and the model runner rely on in a model.

A model class is chosen by the checkpoint's HF `architectures` (lab/models/registry.py), built by
the loader as `cls(hf_config, attn_backend, ops)` under the target device and dtype, then filled
by `load_weights`. Each step the model runner calls

    hidden = model(input_ids, positions, kv_caches, attn_metadata)   # [T] -> [T, hidden]
    logits = model.compute_logits(hidden[logits_indices])            # [N, hidden] -> [N, vocab]

on one flat token batch (requests back to back, see lab/attention/base.py), and the worker sizes
the KV cache from `attention_spec` (per layer) times `num_layers`. `attention_spec_for(hf_config)`
gives the same spec from the config alone, without building the model (what the loader checks
against the backend, and what a simulator needs to count KV bytes per token).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

import torch
from torch import nn

from lab.attention.base import AttentionBackend, AttentionSpec
from lab.layers.ops import LayerOps, TorchOps


class CausalLM(nn.Module, ABC):
    """Base class of the model families: a causal LM over a flat batch with paged attention."""

    #: the attention every layer of this model runs (one spec for all layers)
    attention_spec: AttentionSpec
    #: the decoder layers that own a KV cache (one cache tensor each)
    num_layers: int

    def __init__(
        self, hf_config, attn_backend: AttentionBackend, ops: LayerOps | None = None
    ) -> None:
        """Record the config, the ops (None: TorchOps), the attention spec and the layer count;
        subclasses then build their layers on `attn_backend` (already checked by the loader to
        support `attention_spec`)."""
        super().__init__()
        self.config = hf_config
        self.ops = ops or TorchOps()
        self.attention_spec = self.attention_spec_for(hf_config)
        self.num_layers = hf_config.num_hidden_layers

    @classmethod
    @abstractmethod
    def attention_spec_for(cls, hf_config) -> AttentionSpec:
        """The AttentionSpec of a model of this class with this HF config, built from the config
        alone (no weights, no layers)."""

    @abstractmethod
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor,
        kv_caches: list[torch.Tensor], attn_metadata: object,
    ) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]. kv_caches: one tensor per
        layer (`num_layers`, shaped by the backend's KVCacheSpec); attn_metadata: what the
        backend's `build_metadata` made for this step."""

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states [N, hidden] -> float32 logits [N, vocab]."""

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named tensors strictly: raise ValueError naming every missing, unexpected and
        mis-shaped tensor. Returns the names of the parameters loaded."""
