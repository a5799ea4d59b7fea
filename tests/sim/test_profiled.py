"""The operator-level step-time model (lab/sim/step_time/profiled.py) and its sweep
(lab/sim/profile.py): interpolation, the attention layouts, the variance modes, a profile built
from synthetic samples recovers the costs that made them, and one real sweep of tiny_llama
(a small grid) simulates a run."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import numpy as np
import pytest

from lab.core.step import StepShape
from lab.sim import profile as prof
from lab.sim.step_time.profiled import Curve, Operators, ProfiledStepTime, Surface, whole_blocks
from lab.sim.validate import Row, headline, step_seconds, table


def test_curve_interpolates_and_extrapolates_over_half_its_range():
    c = Curve((1.0, 2.0, 4.0, 8.0), (1.0, 2.0, 3.0, 9.0))
    assert c.at(2.0) == 2.0 and c.at(3.0) == 2.5 and c.at(6.0) == 6.0
    # past the end: the line from the middle point (4, 3) to the last (8, 9), slope 1.5
    assert c.at(10.0) == pytest.approx(12.0)
    # before the start: the line from the first (1, 1) to the middle (4, 3), floored at 0
    assert c.at(0.0) == pytest.approx(1 - 2 / 3)
    assert c.at(-10.0) == 0.0
    assert Curve((4.0,), (2.0,)).at(8.0) == 4.0  # one point: proportional
    with pytest.raises(ValueError, match="increasing"):
        Curve((2.0, 1.0), (1.0, 1.0))


def test_surface_is_linear_between_rows_and_never_cheaper_past_them():
    s = Surface((32.0, 128.0), (Curve((1.0, 2.0), (1.0, 2.0)), Curve((1.0, 2.0), (3.0, 6.0))))
    assert s.at(1.0, 32.0) == 1.0 and s.at(1.0, 80.0) == 2.0 and s.at(2.0, 128.0) == 6.0
    assert s.at(1.0, 224.0) == pytest.approx(5.0)  # extrapolated along the last two rows
    inverted = Surface((32.0, 128.0), (Curve((1.0,), (3.0,)), Curve((1.0,), (1.0,))))
    assert inverted.at(1.0, 512.0) == 3.0  # a noisy inverted pair does not go down


def test_isotonic_pools_violators_by_weight():
    assert prof.isotonic([1.0, 3.0, 2.0, 4.0], [1, 1, 1, 1]) == [1.0, 2.5, 2.5, 4.0]
    assert prof.isotonic([1.0, 5.0, 2.0], [1, 1, 3]) == [1.0, 2.75, 2.75]


def ops_of(padded: bool, cpu=(0.0, 0.0, 0.0, 0.0, 0.0), cpu_decode=(1e-3, 0.0),
           block_size: int = 16) -> Operators:
    """Operators of 1 ms per unit of x (2 ms at key 1024), a CPU term of
    cpu_decode[0] + cpu_decode[1] per request and the `cpu` extras."""
    line = Curve((0.0, 1000.0), (0.0, 1.0))
    a, b = cpu_decode
    return Operators(model=line, logits=line, sampling=line,
                     decode=Surface((16.0, 1024.0), (line, Curve((0.0, 1000.0), (0.0, 2.0)))),
                     prefill=Surface((16.0, 1024.0), (line, Curve((0.0, 1000.0), (0.0, 2.0)))),
                     padded=Surface((16.0, 1024.0), (line, Curve((0.0, 1000.0), (0.0, 2.0)))),
                     cpu_decode=Curve((0.0, 1000.0), (a, a + 1000 * b)), cpu=cpu,
                     padded_batches=padded, block_size=block_size)


def test_padded_attention_pays_for_the_padded_geometry():
    # 2 decodes of contexts 100 and 300 beside one chunk of 64 after 32 cached tokens
    shape = StepShape.of([(1, 99, 100), (1, 299, 300), (64, 32, 96)], num_new=1)
    assert (shape.max_query_len, shape.max_context_len) == (64, 300)
    assert shape.num_sampled_reqs == 3 and shape.num_new_reqs == 1
    padded, ragged = ops_of(True), ops_of(False)
    keys = 304  # 300 in whole blocks of 16
    w = (keys - 16) / (1024 - 16)
    # 3 requests' keys gathered (x = 3 x 304), attending with 64 padded queries each (key 64)
    assert padded.attention(shape) == pytest.approx(3 * 304 * (1 + (64 - 16) / 1008) * 1e-3)
    decode = 2 * (1 + (208 - 16) / 1008) * 1e-3  # 2 decodes of mean context 200: 208 in blocks
    chunk = 64 * (1 + (96 - 16) / 1008) * 1e-3
    assert ragged.attention(shape) == pytest.approx(decode + chunk)
    only_decodes = StepShape.of([(1, 99, 100), (1, 299, 300)])
    assert padded.attention(only_decodes) == pytest.approx(2 * (1 + w) * 1e-3)


def test_a_step_is_the_sum_of_its_operators():
    ops = ops_of(True, cpu=(1e-3, 5e-4, 1e-6, 2e-4, 3e-3), cpu_decode=(1e-3, 1e-4))
    shape = replace(StepShape.of([(1, 9, 10), (20, 0, 20)], num_new=1), num_finished_reqs=1)
    parts = ops.parts(shape)
    assert parts["model"] == pytest.approx(21e-3)
    assert parts["logits"] == parts["sampling"] == pytest.approx(2e-3)
    assert parts["cpu"] == pytest.approx(1e-3 + 2e-4 + 1e-3 + 5e-4 + 20e-6 + 2e-4)
    cold = replace(shape, after_idle=True)  # the first step after a wait for an arrival
    assert ops.parts(cold)["cpu"] == pytest.approx(parts["cpu"] + 3e-3)
    assert ops.predict(shape) == pytest.approx(sum(parts.values()))
    assert ops.predict(StepShape()) == pytest.approx(1e-3)  # an empty step: the cpu constant


def synthetic_samples(padded: bool, noise: float = 0.0, seed: int = 0) -> list[prof.Sample]:
    """Samples of a made-up machine: model 2 us/token + 0.1 ms, attention 50 us + 1 ns per
    query-key pair (padded: + 2 ns per key gathered, pairs of the padded queries), logits and sampling 10 us per sampled request, cpu 0.5 ms + 20 us per request
    + 100 us per new request + 50 us per finishing request + 1 us per token."""
    rng = random.Random(seed)
    samples = []

    def add(chunks, tag, num_new=0, finished=0):
        shape = replace(StepShape.of(chunks, num_new=num_new), num_finished_reqs=finished)
        keys = whole_blocks(shape.max_context_len, 16)
        pairs = (2 * shape.num_reqs * keys
                 + (shape.num_reqs * shape.max_query_len * keys if shape.num_prefill_reqs else 0)
                 if padded else shape.prefill_attention_pairs + shape.decode_context_tokens)
        parts = {"model": 1e-4 + 2e-6 * shape.num_tokens, "attention": 5e-5 + 1e-9 * pairs,
                 "logits": 1e-5 * shape.num_sampled_reqs,
                 "sampling": 1e-5 * shape.num_sampled_reqs,
                 "cpu": 5e-4 + 2e-5 * shape.num_reqs + 1e-4 * num_new + 5e-5 * finished
                 + 1e-6 * shape.num_tokens}
        f = 1 + noise * rng.uniform(-1, 1)
        samples.append(prof.Sample(shape, tag, f * sum(parts.values()),
                                   f * (parts["model"] + parts["attention"]),
                                   f * parts["attention"], f * parts["logits"],
                                   f * parts["sampling"]))

    for _ in range(3):
        for context in (32, 128, 512):
            for batch in (1, 2, 4, 8):
                for t in range(4):
                    add([(1, context - 4 + t, context - 3 + t)] * batch, "decode",
                        finished=batch if t == 3 else 0)
            for q in (32, 128):
                if q <= context:
                    add([(q, context - q, context)], "prefill", num_new=1)
        for n in (2, 4, 8):
            add([(32, 0, 32)] * n, "admit", num_new=n)
    return samples


@pytest.mark.parametrize("padded", [True, False])
def test_a_profile_recovers_the_costs_that_made_its_samples(padded):
    samples = synthetic_samples(padded)
    meta = {"model": "toy", "attention": "torch", "config": {"block_size": 16, "dtype": "fp32"},
            "machine": {"cpu": "toy"}, "commit": "x"}
    profile = prof.build_profile(samples, padded, meta)
    cpu = dict(zip(profile["operators"]["cpu"]["features"],
                   profile["operators"]["cpu"]["coefficients"]))
    steady = Curve.of(profile["operators"]["cpu"]["decode"])
    assert steady.at(4) == pytest.approx(5e-4 + 4 * 2.1e-5, rel=0.01)
    assert cpu["new_requests"] == pytest.approx(1e-4, rel=0.05)
    assert cpu["finished_requests"] == pytest.approx(5e-5, rel=0.05)
    assert profile["fit"]["median_abs_error"] < 0.01
    ops = Operators.of(profile)
    for s in samples:  # every measured step, predicted within 5 %
        assert ops.predict(s.shape) == pytest.approx(s.loop, rel=0.05)
    # a step the sweep never took: 6 decodes of context 300 beside a chunk of 100 after 156
    mixed = StepShape.of([(1, 299, 300)] * 6 + [(100, 156, 256)], num_new=1)
    assert ops.predict(mixed) > ops.predict(StepShape.of([(1, 299, 300)] * 6))


def test_variance_sampling_is_seeded_and_spreads_around_the_median():
    profile = prof.build_profile(synthetic_samples(True, noise=0.3), True,
                                 {"model": "toy", "attention": "torch",
                                  "config": {"block_size": 16}, "machine": {}, "commit": "x"})
    shape = StepShape.of([(1, 99, 100)] * 4)
    median = ProfiledStepTime(profile=profile, variance="median")
    assert len({median.predict(shape) for _ in range(5)}) == 1
    draws = [ProfiledStepTime(profile=profile, variance="sample", seed=7) for _ in range(2)]
    a, b = ([m.predict(shape) for _ in range(200)] for m in draws)
    assert a == b  # same seed, same times
    base = median.predict(shape)
    assert min(a) < base < max(a)
    assert np.quantile(a, 0.99) > 1.1 * base  # the tail is there
    assert "variance sample seed 7" in draws[0].describe()
    assert "variance median" in median.describe()


def test_profiled_refuses_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="sim.step_time.path"):
        ProfiledStepTime(None)
    with pytest.raises(FileNotFoundError, match="lab.sim.profile"):
        ProfiledStepTime(str(tmp_path / "missing.json"))
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"kind": "lab.sim.step_time.profiled", "features": []}))
    with pytest.raises(ValueError, match="not an operator profile"):
        ProfiledStepTime(str(old))
    with pytest.raises(ValueError, match="variance='loud'.*median, sample"):
        ProfiledStepTime(str(old), variance="loud")


def test_a_busy_step_is_timed_from_the_previous_step_end():
    """While requests are unfinished the engine loops without waiting: the whole gap between
    step ends (outputs, loggers, the replay included) is the step's time; after an idle wait
    only the step's own schedule + execute + update counts."""
    idle = {"time": 1.0, "num_running_reqs": 0, "num_waiting_reqs": 0}
    busy = {"time": 1.0, "num_running_reqs": 2, "num_waiting_reqs": 1}
    step = {"time": 1.5, "schedule_time": 0.1, "execute_time": 0.2, "update_time": 0.1}
    assert step_seconds(step, busy) == pytest.approx(0.5)
    assert step_seconds(step, idle) == pytest.approx(0.4)
    assert step_seconds(step, None) == pytest.approx(0.4)


def test_the_validation_table_says_noise_and_ends_with_the_headline():
    rows = [Row("output tok/s", "output_throughput", "p50", [100.0, 110.0, 90.0], [104.0]),
            Row("TTFT p50", "ttft_p50", "p50", [1.0, 1.0, 1.0], [1.2]),
            Row("TTFT p99", "ttft_p99", "p99", [2.0, 2.0, 2.0], [1.5]),
            Row("preemptions", "num_preemptions", "count", [0, 0, 0], [3])]
    assert headline(rows) == pytest.approx((12.0, 25.0))
    lines = table(rows)
    assert "inside noise" in lines[2] and "+4.0 %" in lines[2] and "20.0 %" in lines[2]
    assert "inside noise" not in lines[3]
    assert "n/a" in lines[5]  # 3 preemptions against none
    assert lines[-1] == "median |error| 12.0 % (throughput + p50s), p99 |error| 25.0 %"


def test_a_real_sweep_profiles_tiny_llama_and_simulates_a_run(tmp_path):
    """One small sweep of the real engine: each designed step has the shape it was designed
    for, the operators explain the sweep's own steps, and a simulated run uses the profile."""
    profile = prof.run_profile(["model=tiny_llama", "logger=[]", "cpu_threads=1"], max_batch=4,
                               max_context=128, repeats=1, log=lambda *_: None)
    assert profile["attention_padded"] is True  # attention=torch pads its batches
    assert profile["model"] == "tiny_llama" and profile["config"]["block_size"] == 16
    plan = profile["plan"]
    assert plan["batches"] == [1, 2, 3, 4] and plan["contexts"] == [32, 64, 128]
    decode_rows = {row["key"]: row["x"] for row in profile["operators"]["decode"]}
    assert decode_rows[32.0] == decode_rows[64.0] == decode_rows[128.0] == [1.0, 2.0, 3.0, 4.0]
    # (q, c) chunks through a prefix hit: 32 new tokens after 96 cached ones
    chunks = [s["shape"]["prefill_chunks"] for s in profile["samples"] if s["tag"] == "prefill"]
    assert [[32, 96]] in chunks and [[128, 0]] in chunks
    # padded steps: one row per max query (in whole blocks), chunks of 32 and 128 among them
    assert {32.0, 128.0} <= {row["key"] for row in profile["operators"]["padded"]}
    assert profile["fit"]["median_abs_error"] < 0.5  # the model explains its own sweep
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    from lab import LLM, SamplingParams

    llm = LLM("tiny_llama", executor="sim", **{"sim/step_time": "profiled",
                                               "sim.step_time.path": str(path),
                                               "sim.device": "cpu"})
    outs = llm.generate(["Hello there"] * 3, SamplingParams(max_tokens=5, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 5 for o in outs)
    assert "profiled operators (tiny_llama" in llm.engine.executor.timing()
    assert llm.engine.clock.now() > 0


def test_at_tensor_parallel_n_the_split_operators_take_one_nth():
    ops = ops_of(True)
    shape = StepShape.of([(1, 99, 100)] * 4)
    parts = ops.parts(shape)
    split = parts["model"] + parts["attention"] + parts["logits"]
    assert ops.predict(shape, 2) == pytest.approx(ops.predict(shape) - split / 2)


def test_binding_a_sliding_model_to_a_profile_short_of_its_windows_warns(caplog):
    from lab.sim.device import DEVICES
    from lab.sim.model_shape import ModelShape
    from lab.sim.step_time import SimTarget

    profile = prof.build_profile(synthetic_samples(True), True,
                                 {"model": "toy", "attention": "torch",
                                  "config": {"block_size": 16}, "machine": {}, "commit": "x"})
    measured = max(Operators.of(profile).decode.keys)
    shape = ModelShape(num_layers=2, hidden_size=4, vocab_size=10, num_heads=2, num_kv_heads=1,
                       head_dim=2, intermediate_size=8, kv_elems_per_token=4)
    model = ProfiledStepTime(profile=profile)
    for windows, warns in [((), False), ((measured // 2, None), False),
                           ((measured * 2, None), True)]:
        caplog.clear()
        model.bind(SimTarget(replace(shape, layer_windows=windows), DEVICES["cpu"], 4, 4, 4))
        assert ("inside the model's sliding windows" in caplog.text) == warns


def test_validate_warns_when_a_given_profile_was_measured_otherwise():
    from lab.config.compose import compose_config
    from lab.sim.validate import mismatches

    profile = {"config": prof.fingerprint(compose_config(["cpu_threads=1"]))}
    assert mismatches(profile, ["cpu_threads=1", "workload=poisson"]) == []  # not the workload
    (line,) = mismatches(profile, ["cpu_threads=2"])
    assert line == "cpu_threads: the profile was measured with 1, the runs use 2"
