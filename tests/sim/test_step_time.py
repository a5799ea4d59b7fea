"""Step-time models (lab/sim/step_time) against hand-computed values; the profiled fit recovers a
known linear model, through `python -m lab.sim.profile` too."""

import json

import numpy as np
import pytest

from lab.core.step import StepShape
from lab.sim import profile
from lab.sim.device import DeviceSpec
from lab.sim.model_shape import ModelShape
from lab.sim.step_time import SimTarget
from lab.sim.step_time.constant import ConstantStepTime
from lab.sim.step_time.profiled import FEATURES, ProfiledStepTime, features, fit, nnls
from lab.sim.step_time.roofline import RooflineStepTime

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


def test_roofline_needs_binding_and_binding_leaves_the_built_model_alone():
    with pytest.raises(RuntimeError, match="bind"):
        ROOF.predict(StepShape(num_tokens=1))
    assert ROOF.bind(TARGET) is not ROOF and ROOF.target is None


def test_nnls_matches_a_known_non_negative_solution():
    rng = np.random.default_rng(0)
    a = rng.random((50, 4))
    x = np.array([1.0, 0.0, 2.0, 0.5])
    assert np.allclose(nnls(a, a @ x), x, atol=1e-9)
    # the unconstrained optimum has a negative part: NNLS clamps it to 0
    b = a @ np.array([1.0, -1.0, 0.0, 0.0])
    assert (nnls(a, b) >= 0).all()


def _synthetic_steps(n: int, coef: dict[str, float], seed: int = 0):
    rng = np.random.default_rng(seed)
    shapes = []
    for _ in range(n):
        chunks = [(int(q), int(c), int(q + c)) for q, c in
                  zip(rng.integers(2, 64, rng.integers(0, 3)), rng.integers(0, 256, 3))]
        chunks += [(1, int(c), int(c) + 1) for c in rng.integers(1, 512, rng.integers(0, 16))]
        shapes.append(StepShape.of(chunks))
    truth = np.array([coef.get(name, 0.0) for name in FEATURES])
    times = [float(np.dot(features(s), truth)) * (1 + 0.001 * rng.standard_normal())
             for s in shapes]
    return shapes, times, truth


COEF = {"const": 2e-3, "prefill_tokens": 5e-5, "decode_reqs": 3e-4,
        "prefill_attention_pairs": 1e-8, "decode_context_tokens": 2e-7, "prefill_reqs": 1e-4}


def test_profiled_fit_recovers_a_known_linear_model():
    shapes, times, truth = _synthetic_steps(400, COEF)
    coef, error = fit(np.array([features(s) for s in shapes]), np.array(times))
    assert np.allclose(coef, truth, rtol=0.05, atol=1e-9)
    assert error["r2"] > 0.999 and error["mape"] < 0.01 and error["num_steps"] == 400


def test_profile_cli_fits_run_dirs_and_profiled_loads_it(tmp_path, capsys):
    shapes, times, truth = _synthetic_steps(300, COEF, seed=1)
    run = tmp_path / "run"
    run.mkdir()
    lines = [json.dumps({"num_scheduled_tokens": s.num_tokens,
                         "num_prefill_reqs": s.num_prefill_reqs,
                         "num_decode_reqs": s.num_decode_reqs,
                         "prefill_attention_pairs": s.prefill_attention_pairs,
                         "decode_context_tokens": s.decode_context_tokens,
                         "schedule_time": 0.25 * t, "execute_time": 0.5 * t,
                         "update_time": 0.25 * t, "time": 0.0, "num_running_reqs": 0,
                         "num_waiting_reqs": 0}) for s, t in zip(shapes, times)]
    (run / "steps.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "profile.json"
    profile.main([str(run), "-o", str(out), "--skip-first", "0"])
    assert "300 steps" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["features"] == list(FEATURES) and saved["fit"]["r2"] > 0.999
    assert saved["runs"] == [{"run_dir": str(run)}] and "machine" in saved
    model = ProfiledStepTime(str(out))
    assert model.bind(TARGET) is model
    for s, t in zip(shapes[:20], times[:20]):
        assert model.predict(s) == pytest.approx(t, rel=0.05, abs=1e-6)


def test_profiled_refuses_a_missing_path():
    with pytest.raises(ValueError, match="sim.step_time.path"):
        ProfiledStepTime(None)
    with pytest.raises(FileNotFoundError, match="lab.sim.profile"):
        ProfiledStepTime("/nonexistent/profile.json")


def test_a_busy_step_is_timed_from_the_previous_step_end():
    """While requests are unfinished the engine loops without waiting: the whole gap between
    step ends (outputs, loggers, the replay included) is the step's time; after an idle wait
    only the step's own schedule + execute + update counts."""
    idle = {"time": 1.0, "num_running_reqs": 0, "num_waiting_reqs": 0}
    busy = {"time": 1.0, "num_running_reqs": 2, "num_waiting_reqs": 1}
    step = {"time": 1.5, "schedule_time": 0.1, "execute_time": 0.2, "update_time": 0.1}
    assert profile.step_seconds(step, busy) == pytest.approx(0.5)
    assert profile.step_seconds(step, idle) == pytest.approx(0.4)
    assert profile.step_seconds(step, None) == pytest.approx(0.4)
