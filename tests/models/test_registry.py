"""The model seam: the architectures table (name -> light spec -> model class), the CausalLM
base, and what the specs answer from the config alone (attention spec, router size) without
torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from lab.attention.torch_backend import TorchAttentionBackend
from lab.models.base import CausalLM
from lab.models.loader import load_model
from lab.models.registry import ARCHITECTURES, arch_spec, model_class
from tests.models.conftest import DenseCausalBackend
from tests.options import tiny_models

REPO = Path(__file__).resolve().parents[2]  # `python -c` imports the lab of its cwd


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_every_architecture_names_its_causal_lm_which_holds_the_same_spec(name):
    spec = ARCHITECTURES[name]
    cls = spec.model_class()
    assert issubclass(cls, CausalLM) and cls.__name__ == name
    assert cls.arch_spec is spec


@pytest.mark.parametrize("name", tiny_models())
def test_attention_spec_from_the_config_alone(tiny_path, name):
    cfg = AutoConfig.from_pretrained(tiny_path(name))
    model, _ = load_model(tiny_path(name), TorchAttentionBackend(), torch.float32, "cpu")
    assert type(model) is model_class(cfg)
    assert arch_spec(cfg).attention_spec(cfg) == model.attention_spec
    assert model.num_layers == cfg.num_hidden_layers


def _moe_configs(tiny_path) -> list:
    """The MoE tiny presets' configs, and tiny_deepseek's with V2's grouped routing."""
    cfgs = [AutoConfig.from_pretrained(tiny_path(name)) for name in tiny_models("mla")]
    cfgs = [cfg for cfg in cfgs if getattr(cfg, "n_routed_experts", None)]
    grouped = AutoConfig.from_pretrained(tiny_path("tiny_deepseek"))
    grouped.topk_method, grouped.n_group, grouped.topk_group = "group_limited_greedy", 2, 1
    return [*cfgs, grouped]


def test_router_params_of_the_spec_equal_the_gate_modules(tiny_path):
    cfgs = _moe_configs(tiny_path)
    assert {cfg.architectures[0] for cfg in cfgs} >= {"DeepseekV2ForCausalLM",
                                                       "DeepseekV3ForCausalLM"}
    for cfg in cfgs:
        spec = arch_spec(cfg)
        gate = spec.model_class().make_gate(cfg)
        assert spec.router_params(cfg) == sum(p.numel() for p in gate.parameters()), cfg
        assert (gate.n_group, gate.topk_group) == spec.router_groups(cfg)


def test_an_unsupported_router_is_refused_by_the_spec(tiny_path):
    cfg = AutoConfig.from_pretrained(tiny_path("tiny_deepseek"))
    cfg.topk_method = "noaux_tc"
    with pytest.raises(ValueError, match="topk_method='noaux_tc'"):
        arch_spec(cfg).router_params(cfg)


def test_the_specs_import_neither_torch_nor_model_code():
    code = (
        "import sys\n"
        "from types import SimpleNamespace as NS\n"
        "from lab.models.registry import arch_spec\n"
        "cfg = NS(architectures=['Qwen3ForCausalLM'], num_attention_heads=8,\n"
        "         num_key_value_heads=2, hidden_size=64, head_dim=None)\n"
        "spec = arch_spec(cfg).attention_spec(cfg, tp_size=4)\n"
        "assert (spec.num_heads, spec.num_kv_heads, spec.head_dim) == (2, 1, 8), spec\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] == 'torch'\n"
        "         or m.startswith(('lab.layers', 'lab.kernels', 'lab.attention.base'))\n"
        "         or m in ('lab.models.base', 'lab.models.llama', 'lab.models.deepseek',\n"
        "                  'lab.models.gemma', 'lab.models.gpt_oss')]\n"
        "assert not heavy, heavy\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO)
    assert run.returncode == 0, run.stderr


def test_loader_refuses_a_feature_the_backend_lacks_before_building(tiny_path, monkeypatch):
    """A layer's sliding window (tiny_gemma2: and its soft cap) against a backend that
    implements neither: refused by name, no layer built."""
    cls = model_class(AutoConfig.from_pretrained(tiny_path("tiny_gemma2")))
    monkeypatch.setattr(cls, "__init__", lambda *a, **k: pytest.fail("built the model"))
    monkeypatch.setattr(DenseCausalBackend, "supported_features", frozenset())
    with pytest.raises(ValueError, match="does not implement (sliding_window, )?softcap"):
        load_model(tiny_path("tiny_gemma2"), DenseCausalBackend(), torch.float32, "cpu")


def test_loader_refuses_the_backend_before_building(tiny_path, monkeypatch):
    cls = model_class(AutoConfig.from_pretrained(tiny_path("tiny_deepseek")))
    monkeypatch.setattr(cls, "__init__", lambda *a, **k: pytest.fail("built the model"))
    with pytest.raises(ValueError, match="does not support 'mla'"):
        load_model(tiny_path("tiny_deepseek"), DenseCausalBackend(), torch.float32, "cpu")
