"""The constant and roofline step-time models (lab/sim/step_time) against hand-computed values,
sliding-window layers included (the profiled model: tests/sim/test_profiled.py)."""

import json
from dataclasses import replace

import pytest
from transformers import AutoConfig

from lab.core.step import StepShape
from lab.sim.configs import CONFIGS
from lab.sim.device import DEVICES, DeviceSpec
from lab.sim.model_shape import ModelShape
from lab.sim.step_time import SimTarget
from lab.sim.step_time.constant import ConstantStepTime
from lab.sim.step_time.roofline import RooflineStepTime, windowed_pairs

# 2 layers, hidden 4, vocab 10, 2 heads of 2 over 1 KV head, MLP 8: per layer q 16 + k,v 16 +
# o 16 + MLP 96 = 144 linear weights; LM head 40; norms 2 x 2 x 4 + 4 = 20.
TOY = ModelShape(num_layers=2, hidden_size=4, vocab_size=10, num_heads=2, num_kv_heads=1,
                 head_dim=2, intermediate_size=8, kv_elems_per_token=2 * 1 * 2)
DEVICE = DeviceSpec("toy", peak_flops=1000.0, mem_bandwidth=100.0, memory_bytes=10**6,
                    host_link_bandwidth=10.0)
TARGET = SimTarget(TOY, DEVICE, dtype_bytes=2, linear_bytes=1, kv_dtype_bytes=1)
ROOF = RooflineStepTime(overhead_s=0.5, flops_efficiency=1.0, bandwidth_efficiency=1.0)


def test_constant():
    assert ConstantStepTime(0.01).predict(StepShape(num_tokens=7)) == 0.01
    assert ConstantStepTime(0.01, 0.001).predict(StepShape(num_tokens=5)) == pytest.approx(0.015)
    with pytest.raises(ValueError, match=">= 0"):
        ConstantStepTime(-1.0)


def test_toy_shape():
    assert TOY.linear_params() == (288, 0) and TOY.lm_head_params == 40
    assert TOY.small_params() == 20 and TOY.kv_bytes_per_token(1) == 8


def test_roofline_decode_step_by_hand():
    shape = StepShape.of([(1, 9, 10), (1, 19, 20)])  # two decodes reading 10 + 20 keys
    model = ROOF.bind(TARGET)
    # linear: FLOPs 2 (288 x 2 tokens + 40 x 2 sampled) = 1312 -> 1.312 s; bytes 288 x 1
    # + (40 + 20) x 2 = 408 -> 4.08 s (memory bound)
    assert model.linear(shape) == (1312.0, 408.0)
    # decode: FLOPs 2 x 30 keys x 2 heads x (2 + 2) x 2 layers = 960 -> 0.96 s;
    # bytes (30 read + 2 written) x 8 = 256 -> 2.56 s
    assert model.decode_attention(shape) == (960.0, 256.0)
    assert model.predict(shape) == pytest.approx(0.5 + 4.08 + 2.56)


def test_roofline_prefill_step_by_hand():
    model = ROOF.bind(TARGET)
    first = StepShape.of([(4, 0, 4)])  # pairs 4 x 5 / 2 = 10, no context
    # linear 2 (288 x 4 + 40) = 2384 FLOPs -> 2.384 s < 4.08 s memory; prefill 2 x 10 x 2 x 4 x 2
    # = 320 FLOPs -> 0.32 s, bytes (0 context + 2 x 4 tokens) x 8 = 64 -> 0.64 s
    assert model.prefill_attention(first) == (320.0, 64.0)
    assert model.predict(first) == pytest.approx(0.5 + 4.08 + 0.64)
    chunk = StepShape.of([(4, 8, 12)])  # pairs 4 x 8 + 10 = 42; context recovered: 8
    assert model.prefill_attention(chunk) == (1344.0, (8 + 8) * 8)
    assert model.predict(chunk) == pytest.approx(0.5 + 4.08 + 1.344)
    assert model.predict(StepShape()) == 0.5  # an empty step: the overhead only


def test_roofline_reads_only_the_experts_the_tokens_touch():
    moe = ModelShape(num_layers=2, hidden_size=4, vocab_size=10, num_heads=2, num_kv_heads=2,
                     head_dim=2, intermediate_size=8, kv_elems_per_token=2 * 2 * 2,
                     kv_lora_rank=0, n_routed_experts=8,
                     num_experts_per_tok=2, moe_intermediate_size=2, first_k_dense_replace=1)
    model = ROOF.bind(SimTarget(moe, DEVICE, 2, 1, 1))
    expert = 3 * 4 * 2
    one, many = (model.linear(StepShape(num_tokens=t, num_decode_reqs=t)) for t in (1, 100))
    assert many[1] - one[1] == (8 - 2) * expert  # one MoE layer: 2 experts vs all 8
    assert many[0] == 100 * one[0]


def test_windowed_pairs_count_the_keys_each_query_sees():
    for window in (None, 1, 3, 8):
        for c in range(12):
            for q in range(1, 12):
                seen = sum(min(i + 1, window or i + 1) for i in range(c, c + q))
                assert windowed_pairs(q, c, window) == seen
    assert windowed_pairs(4, 8, None) == 4 * 8 + 10  # StepShape's causal pairs


def test_roofline_counts_each_layer_with_its_window_by_hand():
    model = ROOF.bind(replace(TARGET, model=replace(TOY, layer_windows=(4, None))))
    assert TOY.window_layers() == {None: 2}
    assert model.target.model.window_layers() == {4: 1, None: 1}
    # decodes reading 10 and 20 keys: the full layer 30 keys, the sliding one 4 + 4; 2 heads
    # x (2 + 2) x 2 FLOPs a pair; bytes (keys + 2 written) x 4 per token and layer
    decode = StepShape.of([(1, 9, 10), (1, 19, 20)])
    assert model.decode_attention(decode) == (16.0 * (30 + 8), (32 + 10) * 4.0)
    # a chunk of 4 after 8: the full layer 42 pairs, reading 8 + 4 keys and writing 4; the
    # sliding one 4 queries x 4 keys, reading 3 context keys + 4 and writing 4
    chunk = StepShape.of([(4, 8, 12)])
    assert model.prefill_attention(chunk) == (16.0 * (42 + 16), (16 + 11) * 4.0)
    # a shape without its chunks: equal chunks whose context the pairs give
    bare = StepShape(num_tokens=4, num_prefill_reqs=1, prefill_attention_pairs=42)
    assert model.prefill_attention(bare) == model.prefill_attention(chunk)
    # decodes straddling the window are taken at their mean context (an upper bound)
    assert model.decode_attention(StepShape.of([(1, 1, 2), (1, 7, 8)]))[0] == 16.0 * (10 + 8)


def test_roofline_decode_of_a_sliding_model_is_faster_at_long_context(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS["mistral_7b"]))
    shape = ModelShape.from_hf_config(AutoConfig.from_pretrained(tmp_path))
    sliding = replace(shape, layer_windows=(4096,) * 32)  # Mistral's, whatever its spec says
    full = replace(shape, layer_windows=())
    target = SimTarget(full, DEVICES["h100"], dtype_bytes=2, linear_bytes=2, kv_dtype_bytes=2)
    roof = RooflineStepTime()
    full_model, sliding_model = roof.bind(target), roof.bind(replace(target, model=sliding))
    for context in (1024, 4096):  # inside the window: the same reads
        decode = StepShape.of([(1, context - 1, context)] * 64)
        assert sliding_model.predict(decode) == full_model.predict(decode)
    decode = StepShape.of([(1, 32767, 32768)] * 64)
    keys = [m.decode_attention(decode)[1] for m in (full_model, sliding_model)]
    assert keys[1] / keys[0] == pytest.approx(4097 / 32769)  # each layer reads a window
    assert sliding_model.predict(decode) < 0.5 * full_model.predict(decode)
    prefill = StepShape.of([(2048, 30720, 40000)])
    assert sliding_model.predict(prefill) < full_model.predict(prefill)


def test_roofline_needs_binding_and_binding_leaves_the_built_model_alone():
    with pytest.raises(RuntimeError, match="bind"):
        ROOF.predict(StepShape(num_tokens=1))
    assert ROOF.bind(TARGET) is not ROOF and ROOF.target is None


def test_each_model_says_what_it_is():
    assert ROOF.bind(TARGET).describe().startswith("roofline (uncalibrated: data-sheet peaks")
    assert ConstantStepTime(0.01).describe().startswith("constant")
