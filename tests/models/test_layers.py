"""The building blocks in lab/layers against their definitions and HF's modules."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN
from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from lab.layers.activation import SiluAndMul, gated_activation
from lab.layers.embedding import Embedding, LMHead
from lab.layers.linear import Linear, MergedLinear, QKVLinear
from lab.layers.norm import GemmaRMSNorm, RMSNorm


def test_qkv_linear_fills_shards_and_splits():
    layer = QKVLinear(hidden_size=8, head_dim=2, num_heads=4, num_kv_heads=2, bias=True)
    parts = {s: torch.randn(n, 8) for s, n in zip("qkv", (8, 4, 4))}
    biases = {s: torch.randn(n) for s, n in zip("qkv", (8, 4, 4))}
    for shard in "vqk":  # any order
        layer.weight.weight_loader(layer.weight, parts[shard], shard)
        layer.bias.weight_loader(layer.bias, biases[shard], shard)
    x = torch.randn(3, 8)
    q, k, v = layer.split(layer(x))
    assert q.shape == (3, 4, 2) and k.shape == v.shape == (3, 2, 2)
    for shard, got in zip("qkv", (q, k, v)):  # each head's rows of its shard, loaded in any order
        torch.testing.assert_close(got.reshape(3, -1), F.linear(x, parts[shard], biases[shard]),
                                   msg=shard)


def test_merged_linear_shards_and_shape_errors():
    layer = MergedLinear(4, [3, 5])
    gate, up = torch.randn(3, 4), torch.randn(5, 4)
    layer.weight.weight_loader(layer.weight, up, 1)
    layer.weight.weight_loader(layer.weight, gate, 0)
    torch.testing.assert_close(layer.weight.data, torch.cat([gate, up]))
    with pytest.raises(ValueError, match=r"expected shape \(5, 4\), found \(3, 4\)"):
        layer.weight.weight_loader(layer.weight, gate, 1)
    plain = Linear(4, 6)
    with pytest.raises(ValueError, match="expected shape"):
        plain.weight.weight_loader(plain.weight, torch.zeros(6, 5))


NORMS = {  # ours, transformers', a weight: Gemma's weight is the offset from 1, applied in
    # float32 before the cast
    "llama": (lambda: RMSNorm(16, eps=1e-5), lambda: LlamaRMSNorm(16, eps=1e-5),
              lambda: torch.rand(16) + 0.5),
    "gemma": (lambda: GemmaRMSNorm(16, eps=1e-6), lambda: Gemma2RMSNorm(16, eps=1e-6),
              lambda: 0.3 * torch.randn(16)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm", list(NORMS))
def test_rmsnorm_matches_hf_and_fuses_residual(norm, dtype):
    """Bit-exact against transformers' norm, and the residual add fused."""
    make_ours, make_ref, weight = NORMS[norm]
    ours, ref, w = make_ours(), make_ref(), weight()
    ours.weight.data.copy_(w)
    ref.weight.data.copy_(w)
    ours, ref = ours.to(dtype), ref.to(dtype)
    x, r = torch.randn(5, 16, dtype=dtype), torch.randn(5, 16, dtype=dtype)
    torch.testing.assert_close(ours(x), ref(x), atol=0, rtol=0)
    y, new_r = ours(x, r)
    torch.testing.assert_close(new_r, x + r, atol=0, rtol=0)
    torch.testing.assert_close(y, ref(x + r), atol=0, rtol=0)


def test_silu_and_mul():
    x = torch.randn(4, 10)
    torch.testing.assert_close(SiluAndMul()(x), F.silu(x[:, :5]) * x[:, 5:])


def test_gated_activations_follow_hf_names():
    x = torch.randn(4, 10)
    gelu = gated_activation("gelu_pytorch_tanh")
    torch.testing.assert_close(gelu(x), ACT2FN["gelu_pytorch_tanh"](x[:, :5]) * x[:, 5:],
                               atol=0, rtol=0)
    assert isinstance(gated_activation("silu"), SiluAndMul)
    with pytest.raises(ValueError, match="'relu' is not supported"):
        gated_activation("relu")


def test_tied_lm_head_shares_the_embedding():
    emb, head = Embedding(10, 4), LMHead(10, 4)
    emb.weight.data.normal_()
    head.tie(emb)
    assert head.weight is emb.weight
    h = emb(torch.tensor([1, 7]))
    logits = head(h)
    assert logits.dtype == torch.float32 and logits.shape == (2, 10)
    torch.testing.assert_close(logits, h @ emb.weight.T)
