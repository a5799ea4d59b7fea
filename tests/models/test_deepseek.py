"""DeepSeek-V2/V3 (MLA + MoE): logits parity with transformers through the paged latent cache,
the strict loader with stacked experts, and the routers against transformers' gates."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

from lab.attention.torch_backend import TorchAttentionBackend
from lab.layers.moe import MoE, SigmoidGroupTopKGate, SoftmaxTopKGate
from lab.models.deepseek import DeepseekV2ForCausalLM
from lab.models.loader import load_model
from tests.models.prefill import prefill_logits
from tests.options import tiny_models

PRESETS = tiny_models("mla")
PROMPTS = [[0, 5, 17, 300, 42], list(range(3, 40, 3)), [511, 2, 77] * 9]


def _load(path):
    backend = TorchAttentionBackend()
    return load_model(path, backend, torch.float32, "cpu")[0], backend


def _assert_parity(path, ops=None) -> None:
    backend = TorchAttentionBackend()
    model = load_model(path, backend, torch.float32, "cpu", ops)[0]
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for ids in PROMPTS:
        ours = prefill_logits(model, backend, ids)
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float()
        torch.testing.assert_close(ours, ref, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("name", PRESETS)
def test_logits_match_transformers(tiny_path, name):
    _assert_parity(tiny_path(name))


# tiny_deepseek_lite differs from V2 in q_lora and greedy routing, neither of which is a Triton op
@pytest.mark.parametrize("name", [m for m in PRESETS if m != "tiny_deepseek_lite"])
def test_triton_ops_match_transformers(tiny_path, name):
    """kernels=triton (RMSNorm, gptj / neox rotary on the rope dims, fused MoE; interpreter on
    CPU) keeps parity."""
    from lab.layers.ops import TritonOps

    _assert_parity(tiny_path(name), TritonOps())


def test_bfloat16_load_keeps_router_in_float32(tiny_path):
    model = load_model(tiny_path("tiny_deepseek_v3"), TorchAttentionBackend(), torch.bfloat16,
                       "cpu")[0]
    gate = model.model.layers[1].mlp.gate
    assert model.model.layers[1].mlp.experts.w13.dtype == torch.bfloat16
    assert gate.weight.dtype == gate.e_score_correction_bias.dtype == torch.float32
    logits = prefill_logits(model, TorchAttentionBackend(), PROMPTS[1], dtype=torch.bfloat16)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


def test_v3_without_rope_interleave_matches_transformers(tiny_path, tmp_path):
    dst = tmp_path / "v3_neox"
    shutil.copytree(tiny_path("tiny_deepseek_v3"), dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, "rope_interleave": False}))
    _assert_parity(dst)


def test_structure_spec_and_softmax_scale(tiny_path):
    path = tiny_path("tiny_deepseek")
    model, backend = _load(path)
    spec = model.attention_spec
    assert (spec.kind, spec.num_heads, spec.num_kv_heads, spec.head_dim) == ("mla", 4, 1, 48)
    assert backend.kv_cache_spec(spec, 16, torch.float32).layer_shape(5) == (5, 16, 48)
    layers = model.model.layers
    assert not isinstance(layers[0].mlp, MoE) and all(isinstance(x.mlp, MoE) for x in layers[1:])
    assert isinstance(layers[1].mlp.gate, SoftmaxTopKGate) and layers[1].mlp.gate.n_group == 2
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    hf_scale = hf.model.layers[0].self_attn.scaling
    assert hf_scale != 32**-0.5 and layers[0].self_attn.scale == pytest.approx(hf_scale, rel=1e-12)
    lite, _ = _load(tiny_path("tiny_deepseek_lite"))
    assert hasattr(lite.model.layers[0].self_attn, "q_proj")
    assert not hasattr(lite.model.layers[0].self_attn, "q_a_proj")
    assert lite.model.layers[1].mlp.gate.n_group is None  # topk_method greedy
    v3, _ = _load(tiny_path("tiny_deepseek_v3"))
    assert isinstance(v3.model.layers[2].mlp.gate, SigmoidGroupTopKGate)


def test_loader_stacks_experts(tiny_path):
    path = tiny_path("tiny_deepseek_v3")
    model, _ = _load(path)
    ckpt = load_file(path / "model.safetensors")
    mlp = model.model.layers[2].mlp
    for e in (0, 5, 7):
        prefix = f"model.layers.2.mlp.experts.{e}"
        gate_up = torch.cat((ckpt[f"{prefix}.gate_proj.weight"], ckpt[f"{prefix}.up_proj.weight"]))
        assert torch.equal(mlp.experts.w13[e], gate_up)
        assert torch.equal(mlp.experts.w2[e], ckpt[f"{prefix}.down_proj.weight"])
    assert torch.equal(mlp.gate.weight, ckpt["model.layers.2.mlp.gate.weight"])
    bias = ckpt["model.layers.2.mlp.gate.e_score_correction_bias"]
    assert torch.equal(mlp.gate.e_score_correction_bias, bias) and bias.abs().sum() > 0
    shared = torch.cat((ckpt["model.layers.2.mlp.shared_experts.gate_proj.weight"],
                        ckpt["model.layers.2.mlp.shared_experts.up_proj.weight"]))
    assert torch.equal(mlp.shared_experts.gate_up_proj.weight, shared)


def test_loader_names_missing_unexpected_and_misshaped(tiny_path, tmp_path):
    dst = tmp_path / "edited"
    shutil.copytree(tiny_path("tiny_deepseek_v3"), dst)
    w = load_file(dst / "model.safetensors")
    w.pop("model.layers.1.mlp.experts.3.up_proj.weight")
    w.pop("model.layers.2.mlp.gate.e_score_correction_bias")
    w["model.layers.1.mlp.experts.8.gate_proj.weight"] = torch.zeros(32, 64)  # only 8 experts
    w["model.layers.1.mlp.experts.2.down_proj.weight"] = torch.zeros(64, 33)
    w["model.layers.3.eh_proj.weight"] = torch.zeros(2, 2)  # V3's MTP layer: skipped
    w["model.layers.4.mlp.gate.weight"] = torch.zeros(2, 2)  # beyond it: unexpected
    save_file(w, dst / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError) as err:
        _load(dst)
    msg = str(err.value)
    assert "missing: model.layers.1.mlp.experts.3.up_proj.weight" in msg
    assert "missing: model.layers.2.mlp.gate.e_score_correction_bias" in msg
    assert "unexpected: model.layers.1.mlp.experts.8.gate_proj.weight" in msg
    assert "unexpected: model.layers.4.mlp.gate.weight" in msg
    assert "model.layers.1.mlp.experts.2.down_proj.weight: expected shape (64, 32)" in msg
    assert "layers.3" not in msg


def _hf_router(model_type: str, **overrides):
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    cfg = AutoConfig.for_model(model_type, hidden_size=32, num_attention_heads=4,
                               n_routed_experts=16, num_experts_per_tok=3, **overrides)
    cls = DeepseekV2TopkRouter if model_type == "deepseek_v2" else DeepseekV3TopkRouter
    return cls(cfg), cfg


def _same_routing(ours, theirs) -> None:
    (w, ids), (_, hw, hids) = ours, theirs
    order, hf_order = ids.argsort(-1), hids.argsort(-1)
    assert torch.equal(ids.gather(1, order), hids.gather(1, hf_order))
    torch.testing.assert_close(w.gather(1, order), hw.gather(1, hf_order), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("method", ["greedy", "group_limited_greedy"])
def test_v2_router_matches_transformers(method):
    hf, cfg = _hf_router("deepseek_v2", topk_method=method, n_group=4, topk_group=2,
                         routed_scaling_factor=1.7)
    grouped = method == "group_limited_greedy"
    ours = SoftmaxTopKGate(16, 32, 3, 4 if grouped else None, 2 if grouped else None, 1.7)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(16, 32, generator=gen))
        ours.weight.copy_(hf.weight)
        x = torch.randn(200, 32, generator=gen)
        _same_routing(ours(x), hf(x))


@pytest.mark.parametrize("norm", [True, False])
def test_v3_router_matches_transformers(norm):
    hf, cfg = _hf_router("deepseek_v3", n_group=4, topk_group=2, norm_topk_prob=norm,
                         routed_scaling_factor=2.5)
    ours = SigmoidGroupTopKGate(16, 32, 3, 4, 2, norm, 2.5)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(16, 32, generator=gen) / 4)
        hf.e_score_correction_bias.copy_(0.3 * torch.randn(16, generator=gen))
        ours.weight.copy_(hf.weight)
        ours.e_score_correction_bias.copy_(hf.e_score_correction_bias)
        x = torch.randn(200, 32, generator=gen)
        _same_routing(ours(x), hf(x))


def test_group_limiting_prunes(tiny_path):
    """In the tiny presets n_group 2 / topk_group 1 confines each token's experts to one half."""
    model, _ = _load(tiny_path("tiny_deepseek_v3"))
    gate = model.model.layers[1].mlp.gate
    _, ids = gate(torch.randn(500, 64, generator=torch.Generator().manual_seed(2)))
    assert (ids // 4 == ids[:, :1] // 4).all()  # both picks in the same group of 4
    assert len(set((ids[:, 0] // 4).tolist())) == 2  # ... and both groups get used


@pytest.mark.parametrize("name", PRESETS)
def test_greedy_margins_are_decisive(tiny_path, name):
    model, backend = _load(tiny_path(name))
    ids = torch.randint(3, 512, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    gaps = []
    for _ in range(40):  # greedy, recomputing the whole sequence each step
        top = prefill_logits(model, backend, ids)[-1].topk(2)
        gaps.append((top.values[0] - top.values[1]).item())
        ids.append(int(top.indices[0]))
    assert min(gaps) > 1e-4 and len(set(ids[12:])) > 20  # no near-ties, no short loop


def test_unsupported_v2_topk_method(tiny_path):
    cfg = AutoConfig.from_pretrained(tiny_path("tiny_deepseek"))
    cfg.topk_method = "noaux_tc"
    with pytest.raises(ValueError, match="topk_method='noaux_tc'"):
        DeepseekV2ForCausalLM(cfg, TorchAttentionBackend())
