"""Logits parity with transformers on the tiny presets (fp32, full-sequence forward)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from lab.models.loader import load_model
from tests.models.conftest import DenseCausalBackend, run_model
from tests.options import tiny_models

PROMPTS = [[0, 5, 17, 300, 42], list(range(3, 40, 3)), [511, 2, 77] * 9]


# MLA: tests/models/test_deepseek.py; the hybrid presets' windows, sinks and soft caps are the
# stand-in backend's eager attention (tests/models/conftest.py), and the last prompt outgrows
# their windows
@pytest.mark.parametrize("name", tiny_models("gqa") + tiny_models("hybrid"))
def test_logits_match_transformers(tiny_path, name):
    path = tiny_path(name)
    model, cfg = load_model(path, DenseCausalBackend(), torch.float32, "cpu")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for ids in PROMPTS:
        ours = run_model(model, ids)
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float()
        torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)
        assert ours.dtype == torch.float32


def test_attention_spec_and_tying(tiny_path):
    qwen3, _ = load_model(tiny_path("tiny_qwen3"), DenseCausalBackend(), torch.float32, "cpu")
    assert (qwen3.attention_spec.num_heads, qwen3.attention_spec.num_kv_heads) == (4, 2)
    assert qwen3.attention_spec.head_dim == 32  # explicit head_dim != hidden / heads
    qwen2, _ = load_model(tiny_path("tiny_qwen2"), DenseCausalBackend(), torch.float32, "cpu")
    assert qwen2.lm_head.weight is qwen2.model.embed_tokens.weight
    assert qwen2.model.layers[0].self_attn.qkv_proj.bias is not None
    assert qwen2.model.layers[0].self_attn.o_proj.bias is None


def test_bfloat16_load_runs(tiny_path):
    model, _ = load_model(tiny_path("tiny_llama"), DenseCausalBackend(), torch.bfloat16, "cpu")
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    logits = run_model(model, PROMPTS[0])
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
