"""Fixtures for model tests: a dense single-sequence attention stand-in and cached tiny models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lab.attention.base import AttentionBackend, AttentionSpec, KVCacheSpec
from lab.attention.spec import ATTENTION_FEATURES
from lab.models.tiny import default_cache_dir, ensure_tiny_model


class DenseCausalBackend(AttentionBackend):
    """Causal attention over one sequence (the whole step), no KV cache: a test stand-in. A
    layer with attention features (sliding window, sinks, soft cap) is attended eagerly, as
    transformers' eager attention does: scores soft-capped, masked, a sink column in the
    softmax (fp32)."""

    name = "dense_test"
    supported_features = frozenset(ATTENTION_FEATURES)

    def kv_cache_spec(self, spec: AttentionSpec, block_size: int, dtype: torch.dtype) -> KVCacheSpec:
        return KVCacheSpec((1,), dtype, 0, block_size)

    def forward(self, layer_idx, q, k, v, kv_cache, metadata, scale, *, sliding_window=None,
                sinks=None, softcap=None):
        if (sliding_window, sinks, softcap) != (None, None, None):
            return _eager_attention(q, k, v, scale, sliding_window, sinks, softcap)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
            is_causal=True, scale=scale, enable_gqa=q.shape[1] != k.shape[1],
        )
        return out.transpose(0, 1)


def _eager_attention(q, k, v, scale, window, sinks, softcap) -> torch.Tensor:
    """q [T, H, D], k / v [T, Hkv, D] of one sequence -> [T, H, D] with the layer's features."""
    t, h = q.shape[:2]
    k, v = (x.repeat_interleave(h // x.shape[1], dim=1).float() for x in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    seen = (j <= i) & ((i - j < window) if window is not None else True)
    scores = scores.masked_fill(~seen, -torch.inf)
    if sinks is not None:
        scores = torch.cat((scores, sinks.float().view(h, 1, 1).expand(h, t, 1)), dim=-1)
    probs = scores.softmax(dim=-1)[..., :t]  # the sink column dropped after the softmax
    return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)


def run_model(model, ids: list[int]) -> torch.Tensor:
    """Logits [T, vocab] of one sequence through a lab model with the dense backend."""
    input_ids = torch.tensor(ids, dtype=torch.long)
    positions = torch.arange(len(ids))
    with torch.no_grad():
        hidden = model(input_ids, positions, [None] * model.num_layers, None)
        return model.compute_logits(hidden)


@pytest.fixture(scope="session")
def model_cache() -> Path:
    """The shared tiny-model cache ($LAB_CACHE_DIR, else ~/.cache/lab/models), as the engine
    tests use: a preset is generated once (keyed by its spec's hash), not once per session."""
    return default_cache_dir()


@pytest.fixture(scope="session")
def tiny_path(model_cache):
    """tiny_path(name) -> the directory of a tiny preset (generated on first use)."""

    def get(name: str) -> Path:
        return ensure_tiny_model(name, model_cache)

    return get
