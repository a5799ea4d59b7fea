"""RoPE scalings (linear, dynamic, llama3, yarn) against transformers: cos/sin and logits."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig
from transformers import LlamaForCausalLM as HFLlama
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from lab.layers.rotary import RotaryEmbedding
from lab.models.llama import LlamaForCausalLM
from lab.models.tiny import redraw_weights
from tests.models.conftest import DenseCausalBackend, run_model

SCALINGS = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "yarn_attn_factor": {"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.3,
                         "beta_fast": 16, "beta_slow": 2, "original_max_position_embeddings": 64},
}


def llama_config(rope: dict):
    return AutoConfig.for_model(
        "llama", hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=128, max_position_embeddings=256,
        rope_parameters={**rope, "rope_theta": 10000.0}, architectures=["LlamaForCausalLM"],
    )


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_cos_sin_match_hf(kind):
    cfg = llama_config(SCALINGS[kind])
    ours = RotaryEmbedding.from_hf_config(cfg, 16)
    positions = torch.arange(200)
    cos_ref, sin_ref = LlamaRotaryEmbedding(cfg)(torch.zeros(1), positions[None])
    cos, sin = ours.cos_sin(positions, torch.float32)
    torch.testing.assert_close(cos, cos_ref[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(sin, sin_ref[0], atol=1e-6, rtol=0)
    if kind.startswith("yarn"):
        assert ours.attention_scaling > 1.0


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_logits_match_hf(kind):
    cfg = llama_config(SCALINGS[kind])
    torch.manual_seed(0)
    hf = HFLlama(cfg).eval()
    redraw_weights(hf, cfg)
    model = LlamaForCausalLM(cfg, DenseCausalBackend())
    model.load_weights(hf.state_dict().items())
    ids = torch.randint(0, 128, (200,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(run_model(model, ids), ref, atol=1e-4, rtol=1e-4)


def test_rotary_is_relative():
    """q·k after RoPE depends only on the position difference (no scaling)."""
    rope = RotaryEmbedding(1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16)), 64)
    q, k = torch.randn(1, 1, 16).expand(2, 1, 16), torch.randn(1, 1, 16).expand(2, 1, 16)
    rq, rk = rope(torch.tensor([5, 30]), q, torch.zeros_like(q))[0], rope(torch.tensor([3, 28]), k, k)[1]
    dots = (rq * rk).sum(-1)
    torch.testing.assert_close(dots[0], dots[1], atol=1e-5, rtol=1e-5)
