"""Shared helpers for the quantization tests: load a tiny model under a quant config and compare
its next-token distributions with the unquantized model's over a fixed prompt set."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from lab.attention.base import AttentionBackend, AttentionSpec, KVCacheSpec
from lab.frontend.tokenizer import load_tokenizer
from lab.layers.ops import TorchOps
from lab.models.loader import load_model
from lab.models.tiny import ensure_tiny_model

PROMPTS = (
    "The quick brown fox jumps over the lazy dog and keeps on running",
    "Once upon a time in a small village there lived an old clockmaker",
    "In the beginning the engine scheduled every request it could fit",
    "Paged attention stores the keys and values of each token in blocks",
    "She opened the window, looked at the rain, and went back to sleep",
    "Numbers: one two three four five six seven eight nine ten eleven",
    "A mixture of experts routes each token to a few of its feed-forward",
    "Quantization trades a little accuracy for memory and for speed",
)


class DenseBackend(AttentionBackend):
    """Causal attention over one sequence, no KV cache (a stand-in for the quality tests)."""

    name = "dense_quant_test"

    def kv_cache_spec(self, spec: AttentionSpec, block_size: int, dtype: torch.dtype) -> KVCacheSpec:
        return KVCacheSpec((1,), dtype, 0, block_size)

    def forward(self, layer_idx, q, k, v, kv_cache, metadata, scale):
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, scale=scale,
            enable_gqa=q.shape[1] != k.shape[1])
        return out.transpose(0, 1)


def tiny(name: str):
    return ensure_tiny_model(name)


def load(path, quant=None, ops=None, backend=None):
    """The model at `path` in fp32 on the CPU (backend: DenseBackend; MLA models need another)."""
    backend = backend or DenseBackend()
    model, _ = load_model(path, backend, torch.float32, "cpu", ops or TorchOps(), quant)
    return model


def logits_of(model, ids: list[int]) -> torch.Tensor:
    dev = next(model.parameters()).device
    with torch.no_grad():
        hidden = model(torch.tensor(ids, device=dev), torch.arange(len(ids), device=dev),
                       [None] * model.num_layers, None)
        return model.compute_logits(hidden).float()


@dataclass
class Quality:
    """KL(p_ref || p_quant) per position (mean and max) and greedy (argmax) agreement."""

    kl_mean: float
    kl_max: float
    agreement: float
    positions: int

    def __str__(self) -> str:
        return (f"KL mean {self.kl_mean:.2e} max {self.kl_max:.2e}, greedy agreement "
                f"{self.agreement:.3f} over {self.positions} positions")


def compare(ref_model, quant_model, prompt_ids: list[list[int]]) -> Quality:
    kls, agree = [], []
    for ids in prompt_ids:
        ref, q = logits_of(ref_model, ids), logits_of(quant_model, ids)
        lp_ref, lp_q = ref.log_softmax(-1), q.log_softmax(-1)
        kls.append((lp_ref.exp() * (lp_ref - lp_q)).sum(-1))
        agree.append(ref.argmax(-1) == q.argmax(-1))
    kl, ag = torch.cat(kls), torch.cat(agree)
    return Quality(kl.mean().item(), kl.max().item(), ag.float().mean().item(), kl.numel())


@pytest.fixture(scope="session")
def prompt_ids():
    """prompt_ids(path) -> the fixed prompts tokenized by that model's tokenizer."""
    def get(path) -> list[list[int]]:
        tok = load_tokenizer(path)
        return [tok.encode(p) for p in PROMPTS]

    return get
