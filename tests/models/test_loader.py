"""The loader: sharded checkpoints, the strict check, architectures, dtypes."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from lab.models.loader import load_model, resolve_dtype
from lab.models.registry import ARCHITECTURES
from lab.models.tiny import generate_tiny_model
from tests.models.conftest import DenseCausalBackend


def _load(path):
    return load_model(path, DenseCausalBackend(), torch.float32, "cpu")[0]


def _copy_with(tiny_path, tmp_path, edit):
    """A copy of tiny_llama whose weights `edit(dict)` changed."""
    dst = tmp_path / "ckpt"
    shutil.copytree(tiny_path("tiny_llama"), dst)
    weights = load_file(dst / "model.safetensors")
    edit(weights)
    save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_sharded_equals_single_file(tiny_path, tmp_path):
    sharded = generate_tiny_model("tiny_llama", tmp_path / "sharded", max_shard_size="40KB")
    files = sorted(p.name for p in sharded.glob("*.safetensors"))
    assert len(files) > 2 and (sharded / "model.safetensors.index.json").exists()
    save_file({"junk": torch.zeros(3)}, sharded / "stale-unlisted.safetensors")  # not in the index
    a, b = _load(tiny_path("tiny_llama")).state_dict(), _load(sharded).state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_missing_tensor_is_named(tiny_path, tmp_path):
    name = "model.layers.1.self_attn.k_proj.weight"
    path = _copy_with(tiny_path, tmp_path, lambda w: w.pop(name))
    with pytest.raises(ValueError, match=f"missing: {name}"):
        _load(path)


def test_extra_and_misshaped_tensors_are_named(tiny_path, tmp_path):
    def edit(w):
        w["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(2, 2)
        w["model.layers.0.mlp.up_proj.weight"] = torch.zeros(100, 64)
        w["model.norm.weight"] = torch.ones(65)

    with pytest.raises(ValueError) as err:
        _load(_copy_with(tiny_path, tmp_path, edit))
    msg = str(err.value)
    assert "unexpected: model.layers.0.mlp.extra_proj.weight" in msg
    assert "model.layers.0.mlp.up_proj.weight: expected shape (128, 64), found (100, 64)" in msg
    assert "model.norm.weight: expected shape (64,), found (65,)" in msg


def test_tied_checkpoint_may_carry_lm_head(tiny_path, tmp_path):
    dst = tmp_path / "tied"
    shutil.copytree(tiny_path("tiny_qwen2"), dst)
    weights = load_file(dst / "model.safetensors")
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
    assert _load(dst).lm_head.weight.shape == (512, 64)


def test_unsupported_architecture(tiny_path, tmp_path):
    dst = tmp_path / "gpt2"
    shutil.copytree(tiny_path("tiny_llama"), dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="GPT2LMHeadModel") as err:
        _load(dst)
    assert all(arch in str(err.value) for arch in ARCHITECTURES)


def test_resolve_dtype(tiny_path):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(tiny_path("tiny_llama"))
    cfg.dtype = torch.bfloat16
    assert resolve_dtype("auto", cfg, "cpu") == torch.float32
    assert resolve_dtype("auto", cfg, "cuda") == torch.bfloat16
    assert resolve_dtype("bf16", cfg, "cpu") == torch.bfloat16
    assert resolve_dtype("half", cfg, "cpu") == torch.float16
    assert resolve_dtype("fp32", cfg, "cuda") == torch.float32
    with pytest.raises(ValueError, match="allowed: auto"):
        resolve_dtype("int8", cfg, "cpu")
