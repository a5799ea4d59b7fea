"""Unit tests of lab/quant: each method's layer math against a dense reference, the weight
layouts it stores, fused-layer scale reconciliation, refusals, and the Hydra group."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hydra.utils import instantiate

from lab.attention.torch_backend import TorchAttentionBackend
from lab.config.compose import compose_config
from lab.layers.linear import Linear, MergedLinear, QKVLinear, UnquantizedLinearMethod
from lab.layers.ops import TorchOps
from lab.quant.base import QuantConfig
from lab.quant.fp8 import Fp8CheckpointLinearMethod, Fp8Config, quantize_fp8_weight
from lab.quant.int8 import Int8Config
from lab.quant.none import NoQuantConfig
from lab.quant.w4a16 import W4A16Config
from tests.options import options
from tests.quant.conftest import load, tiny

OPS = TorchOps()


def quantized_layer(config, layer: Linear, weight: torch.Tensor, bias=None) -> Linear:
    """Give `layer` the config's method, load `weight` (and bias), process it."""
    config.ops = OPS
    method = config.method_for("layer", layer)
    layer.set_quant_method(method)
    if method.__class__.__name__.startswith("Fp8Checkpoint"):
        raise AssertionError("use the online path here")
    layer.weight.data.copy_(weight)
    if bias is not None:
        layer.bias.data.copy_(bias)
    method.process_weights_after_loading(layer)
    return layer


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("config, bound", [
    (Int8Config(), 0.02),
    (Fp8Config("per_channel", "per_token"), 0.06),
    (Fp8Config("per_tensor", "per_tensor"), 0.08),
    (W4A16Config(group_size=32, symmetric=True), 0.15),
    (W4A16Config(group_size=32, symmetric=False), 0.12),
], ids=["int8", "fp8-channel-token", "fp8-tensor-tensor", "w4a16-sym", "w4a16-asym"])
def test_layer_close_to_dense(config, bound):
    torch.manual_seed(0)
    w, b, x = torch.randn(96, 64), torch.randn(96), torch.randn(5, 7, 64)
    layer = quantized_layer(config, Linear(64, 96, bias=True), w, b)
    y = layer(x)
    assert y.shape == (5, 7, 96) and y.dtype == x.dtype
    err = rel_err(y, torch.nn.functional.linear(x, w, b))
    print(f"{config!r}: relative error {err:.4f} (bound {bound})")
    assert err < bound
    assert not any(p.dtype == torch.float32 and p.shape == w.shape for p in layer.parameters())


def test_stored_layouts():
    w = torch.randn(96, 64)
    int8 = quantized_layer(Int8Config(), Linear(64, 96), w)
    assert int8.weight.dtype == torch.int8 and int8.weight_scale.shape == (96,)
    fp8 = quantized_layer(Fp8Config("per_tensor"), Linear(64, 96), w)
    assert fp8.weight.dtype == torch.float8_e4m3fn and fp8.weight_scale.shape == (1,)
    w4 = quantized_layer(W4A16Config(group_size=32, symmetric=False), Linear(64, 96), w)
    assert w4.weight.dtype == torch.uint8 and w4.weight.shape == (96, 32)
    assert w4.weight_scale.shape == (96, 2) and w4.weight_zero.shape == (96, 2)
    sym = quantized_layer(W4A16Config(group_size=32), Linear(64, 96), w)
    assert not hasattr(sym, "weight_zero")


def test_int8_matches_explicit_dequant():
    """y == (round(x / s_x) s_x) @ (round(W / s_w) s_w)^T: per-token and per-channel scales."""
    torch.manual_seed(1)
    w, x = torch.randn(32, 64), torch.randn(6, 64)
    layer = quantized_layer(Int8Config(), Linear(64, 32), w)
    s_w = w.abs().amax(1, keepdim=True) / 127
    s_x = x.abs().amax(1, keepdim=True) / 127
    ref = (torch.round(x / s_x) * s_x) @ (torch.round(w / s_w) * s_w).T
    torch.testing.assert_close(layer(x), ref, rtol=1e-4, atol=1e-4)


def test_fused_qkv_online_equals_shards():
    """Per-channel int8 of a fused qkv == quantizing q, k, v separately (rows keep their scale)."""
    torch.manual_seed(2)
    qkv = QKVLinear(64, 16, 4, 2)
    shards = {"q": torch.randn(64, 64), "k": 5 * torch.randn(32, 64), "v": 0.1 * torch.randn(32, 64)}
    config = Int8Config()
    config.ops = OPS
    qkv.set_quant_method(config.method_for("qkv", qkv))
    for sid, t in shards.items():
        qkv.weight.weight_loader(qkv.weight, t, sid)
    qkv.quant_method.process_weights_after_loading(qkv)
    x = torch.randn(3, 64)
    for (sid, t), y in zip(shards.items(), qkv(x).split(qkv.output_sizes, -1)):
        single = quantized_layer(Int8Config(), Linear(64, t.shape[0]), t)
        torch.testing.assert_close(y, single(x), rtol=0, atol=0, msg=sid)


def test_fp8_checkpoint_per_shard_scales_reconciled():
    """Per-tensor scales of q/k/v (and per-channel ones) land in the rows of their shard."""
    torch.manual_seed(3)
    qkv = QKVLinear(64, 16, 4, 2)
    qkv.set_quant_method(Fp8CheckpointLinearMethod(OPS, per_token=True))
    assert qkv.weight.dtype == torch.float8_e4m3fn and qkv.weight_scale.shape == (128,)
    dense = {"q": torch.randn(64, 64), "k": 4 * torch.randn(32, 64), "v": 0.2 * torch.randn(32, 64)}
    for sid, t in dense.items():
        q, s = quantize_fp8_weight(t, per_channel=sid == "v")  # v: per channel, q/k: per tensor
        qkv.weight.weight_loader(qkv.weight, q, sid)
        qkv.weight_scale.weight_loader(qkv.weight_scale, s if sid == "v" else s.reshape(()), sid)
    scale = qkv.weight_scale.data
    assert torch.all(scale[:64] == scale[0]) and torch.all(scale[64:96] == scale[64])
    assert scale[0] != scale[64] and len(set(scale[96:].tolist())) > 1
    x = torch.randn(4, 64)
    ref = x @ torch.cat(list(dense.values())).T
    assert rel_err(qkv(x), ref) < 0.06
    with pytest.raises(ValueError, match="weight_scale: expected 1 or 32"):
        qkv.weight_scale.weight_loader(qkv.weight_scale, torch.ones(5), "k")


def test_merged_gate_up_w4a16():
    """A fused gate_up under w4a16: each half equals that shard quantized alone (groups run along
    input columns, so rows keep their scales), and the whole is close to the dense product."""
    torch.manual_seed(4)
    gate, up = torch.randn(48, 64), 3 * torch.randn(48, 64)
    layer = quantized_layer(W4A16Config(group_size=16), MergedLinear(64, [48, 48]),
                            torch.cat([gate, up]))
    x = torch.randn(5, 64)
    y = layer(x)
    assert y.shape == (5, 96)
    for name, t, half in zip(("gate", "up"), (gate, up), y.split(48, -1)):
        single = quantized_layer(W4A16Config(group_size=16), Linear(64, 48), t)
        torch.testing.assert_close(half, single(x), rtol=0, atol=0, msg=name)
        assert rel_err(half, x @ t.T) < 0.12, name  # g16 int4: 8.5% mean, 10.3% worst of 200 seeds


def test_w4a16_refuses_group_size_not_dividing_k():
    config = W4A16Config(group_size=128)
    with pytest.raises(ValueError, match="mlp.down_proj: input size 64 is not a multiple of quant.group_size=128"):
        config.method_for("mlp.down_proj", Linear(64, 32))


def test_config_knob_validation():
    with pytest.raises(ValueError, match="weight_scheme"):
        Fp8Config(weight_scheme="per_block")
    with pytest.raises(ValueError, match="activation_scheme"):
        Fp8Config(activation_scheme="static")
    with pytest.raises(ValueError, match="experts"):
        Int8Config(experts="maybe")
    with pytest.raises(ValueError, match="group_size"):
        W4A16Config(group_size=0)


def test_dense_checkpoint_with_quantization_config_is_refused():
    with pytest.raises(ValueError, match="quant=int8 loads dense checkpoints only"):
        Int8Config().check_checkpoint({"quant_method": "gptq", "bits": 4})
    with pytest.raises(ValueError, match="quant=w4a16 loads dense checkpoints only"):
        W4A16Config().check_checkpoint({"quant_method": "awq"})
    with pytest.raises(ValueError, match="quant=none"):
        NoQuantConfig().check_checkpoint({"quant_method": "fp8"})
    with pytest.raises(ValueError, match="block-wise"):
        Fp8Config().check_checkpoint({"quant_method": "fp8", "weight_block_size": [128, 128]})
    with pytest.raises(ValueError, match="dynamic only"):
        Fp8Config().check_checkpoint({"quant_method": "fp8", "activation_scheme": "static"})


@pytest.mark.parametrize("option", options("quant"))
def test_hydra_group(option):
    config = instantiate(compose_config([f"quant={option}"]).quant)
    assert isinstance(config, QuantConfig) and config.name == option
    if type(config).__module__.startswith("lab."):  # lab's own: one file per method
        assert type(config).__module__ == f"lab.quant.{option}"


def test_hydra_knobs():
    cfg = compose_config(["quant=w4a16", "quant.group_size=32", "quant.symmetric=false"])
    q = instantiate(cfg.quant)
    assert (q.group_size, q.symmetric) == (32, False)
    cfg = compose_config(["quant=fp8", "quant.weight_scheme=per_tensor",
                          "quant.activation_scheme=per_tensor"])
    q = instantiate(cfg.quant)
    assert (q.weight_scheme, q.activation_scheme) == ("per_tensor", "per_tensor")
    assert type(instantiate(compose_config([]).quant)) is NoQuantConfig


def test_default_is_unquantized():
    model = load(tiny("tiny_llama"))
    assert all(isinstance(m.quant_method, UnquantizedLinearMethod)
               for m in model.modules() if isinstance(m, Linear))


@pytest.mark.parametrize("config", [Int8Config(experts="refuse"), Fp8Config(experts="refuse"),
                                    W4A16Config(group_size=16),
                                    W4A16Config(group_size=16, experts="quantize")],
                         ids=["int8-refuse", "fp8-refuse", "w4a16", "w4a16-quantize"])
def test_deepseek_refuses_moe_experts(config):
    with pytest.raises(ValueError, match=r"cannot quantize the MoE experts at model\.layers\.1\.mlp\.experts.*quant\.experts=dense"):
        load(tiny("tiny_deepseek"), config, backend=TorchAttentionBackend())


@pytest.mark.parametrize("config,dtype,bound", [(Int8Config(), torch.int8, 0.03),
                                                (Fp8Config(), torch.float8_e4m3fn, 0.1)],
                         ids=["int8", "fp8"])
def test_deepseek_experts_quantized_by_default(config, dtype, bound):
    """int8 / fp8 store the routed experts as 8-bit weights with per-expert, per-channel scales
    (kv_b_proj stays dense); the MoE layer's output stays close to the dense model's."""
    dense = load(tiny("tiny_deepseek"), backend=TorchAttentionBackend())
    model = load(tiny("tiny_deepseek"), config, backend=TorchAttentionBackend())
    experts, ref_experts = model.model.layers[1].mlp.experts, dense.model.layers[1].mlp.experts
    e, two_i, hidden = ref_experts.w13.shape
    assert experts.w13.dtype == experts.w2.dtype == dtype
    assert experts.w13_scale.shape == (e, two_i) and experts.w2_scale.shape == (e, hidden)
    assert model.model.layers[0].self_attn.kv_b_proj.weight.dtype == torch.float32
    x = torch.randn(32, hidden, generator=torch.Generator().manual_seed(0))
    weights, ids = dense.model.layers[1].mlp.gate(x)
    want, got = ref_experts(x, weights, ids), experts(x, weights, ids)
    rel = ((got - want).norm() / want.norm()).item()
    print(f"\n[tiny_deepseek quant={config.name}] routed experts: relative error {rel:.4f}")
    assert rel < bound


def test_deepseek_experts_dense_and_kv_b_proj_dense():
    """experts=dense: routed experts stay fp32, kv_b_proj (MLA views) stays dense, the rest int8."""
    model = load(tiny("tiny_deepseek"), Int8Config(experts="dense"), backend=TorchAttentionBackend())
    attn = model.model.layers[0].self_attn
    assert isinstance(attn.kv_b_proj.quant_method, UnquantizedLinearMethod)
    assert attn.kv_b_proj.weight.dtype == torch.float32
    assert attn.q_a_proj.weight.dtype == torch.int8
    assert model.model.layers[1].mlp.experts.w13.dtype == torch.float32
    assert model.model.layers[1].mlp.shared_experts.gate_up_proj.weight.dtype == torch.int8


def test_w4a16_refuses_deepseek_layer_by_name():
    """tiny_deepseek's q_b_proj has input size 48 (q_lora_rank): group 32 is refused by name."""
    with pytest.raises(ValueError, match=r"q_b_proj: input size 48 is not a multiple"):
        load(tiny("tiny_deepseek"), W4A16Config(group_size=32, experts="dense"),
             backend=TorchAttentionBackend())


def test_bind_returns_a_bound_copy_and_leaves_the_config_unchanged():
    config = Fp8Config()
    before = dict(vars(config))
    ckpt = SimpleNamespace(quantization_config={"quant_method": "fp8", "ignored_layers": ["o_proj"]})
    ops = TorchOps()
    bound = config.bind(ckpt, ops)
    assert bound is not config and isinstance(bound, Fp8Config)
    assert (bound.ops, bound.serialized, bound.ignored) == (ops, True, ("o_proj",))
    assert vars(config) == before  # the Hydra-built option is never mutated
    assert config.bind(SimpleNamespace(), ops).serialized is False
