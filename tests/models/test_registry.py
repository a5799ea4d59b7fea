"""The model seam: the architectures table, the CausalLM base and the config-only attention spec."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from lab.attention.torch_backend import TorchAttentionBackend
from lab.models.base import CausalLM
from lab.models.loader import load_model
from lab.models.registry import ARCHITECTURES, model_class
from tests.models.conftest import DenseCausalBackend
from tests.options import tiny_models


def test_every_architecture_is_a_causal_lm():
    assert all(issubclass(cls, CausalLM) for cls in ARCHITECTURES.values())


@pytest.mark.parametrize("name", tiny_models())
def test_attention_spec_from_the_config_alone(tiny_path, name):
    cfg = AutoConfig.from_pretrained(tiny_path(name))
    model, _ = load_model(tiny_path(name), TorchAttentionBackend(), torch.float32, "cpu")
    assert model_class(cfg).attention_spec_for(cfg) == model.attention_spec
    assert model.num_layers == cfg.num_hidden_layers


def test_loader_refuses_the_backend_before_building(tiny_path, monkeypatch):
    cls = model_class(AutoConfig.from_pretrained(tiny_path("tiny_deepseek")))
    monkeypatch.setattr(cls, "__init__", lambda *a, **k: pytest.fail("built the model"))
    with pytest.raises(ValueError, match="does not support 'mla'"):
        load_model(tiny_path("tiny_deepseek"), DenseCausalBackend(), torch.float32, "cpu")
