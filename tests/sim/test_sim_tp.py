"""`executor=sim` with tensor_parallel_size > 1 (lab/sim/comm.py, the per-rank ModelShape): the
ring all-reduce formula and a measured table by hand, one gloo measurement between 2 local
processes, per-rank KV and weight bytes of Llama-3-8B and DeepSeek-V3 from their configs, and
simulated runs whose steps are one rank's compute plus exactly the step's collectives. (The
per-rank counts equal the loaded TP=2 tiny models': tests/models/test_tp_models.py.)"""

import json
from pathlib import Path

import pytest
from transformers import AutoConfig

from lab import LLM, SamplingParams
from lab.core.step import StepShape
from lab.executor.base import Executor
from lab.executor.sim import SimExecutor
from lab.sim.comm import (
    AllReduceTiming,
    MeasuredAllReduce,
    RingAllReduce,
    measure_allreduce,
    step_comm_seconds,
)
from lab.sim.configs import write_configs
from lab.sim.device import DEVICES, DeviceSpec
from lab.sim.model_shape import ModelShape
from lab.sim.step_time import SimTarget, StepTimeModel
from tests.procs import run_python

REPO = Path(__file__).resolve().parents[2]
GiB = 2**30


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    return write_configs(tmp_path_factory.mktemp("configs"))


# -- the all-reduce models ----------------------------------------------------------------------
def test_ring_allreduce_by_hand():
    ring = RingAllReduce(2, bus_bandwidth=100e9, latency_s=5e-6, step_latency_s=1e-6)
    # 5 us + 2 steps x 1 us + 2 (2-1)/2 x 1 MB / 100 GB/s = 7 us + 10 us
    assert ring.seconds(1e6) == pytest.approx(17e-6)
    four = RingAllReduce(4, 100e9, 5e-6, 1e-6)
    assert four.steps == 6
    assert four.seconds(1e6) == pytest.approx(5e-6 + 6e-6 + 1.5 * 1e6 / 100e9)
    assert four.gather_seconds(2e6) == four.seconds(1e6)  # same bus traffic as half the bytes
    assert RingAllReduce(1, 0.0).seconds(1e9) == 0.0  # one rank: nothing to reduce
    # the devices' constants: NVLink 4 one direction x 0.8, NCCL's ring/LL latency model
    h100 = RingAllReduce.for_device(DEVICES["h100"], 8)
    assert h100.bus_bandwidth == 360e9 and DEVICES["a100"].allreduce_bandwidth == 240e9
    assert h100.seconds(0) == pytest.approx(6.6e-6 + 14 * 0.6e-6)  # 15 us at 8 GPUs
    toy = DeviceSpec("toy", 1.0, 1.0, 10, 1.0)
    with pytest.raises(ValueError, match="no interconnect"):
        RingAllReduce.for_device(toy, 2)


def test_measured_allreduce_interpolates_extrapolates_and_round_trips(tmp_path):
    table = MeasuredAllReduce({400: 3.0, 100: 1.0, 200: 2.0}, world_size=2, source="hand")
    assert [table.seconds(b) for b in (0, 50, 100, 150, 200, 300, 400)] == [
        1.0, 1.0, 1.0, 1.5, 2.0, 2.5, 3.0]
    assert table.seconds(600) == pytest.approx(4.0)  # the last segment's slope, 1 s / 200 B
    noisy = MeasuredAllReduce([(100, 2.0), (200, 1.5)], 2)
    assert noisy.seconds(1000) == 1.5  # a falling last segment extrapolates flat
    assert MeasuredAllReduce({64: 1e-4}, 2).seconds(1e9) == 1e-4
    saved = json.loads(json.dumps(table.to_dict()))
    again = MeasuredAllReduce.from_dict(saved)
    assert (again.sizes, again.times, again.world_size, again.source) == (
        table.sizes, table.times, 2, "hand")
    (tmp_path / "profile.json").write_text(json.dumps({"features": [], "allreduce": saved}))
    assert MeasuredAllReduce.load(tmp_path / "profile.json").times == table.times
    timings = [AllReduceTiming(16, 2e-4, 1e-4, 3e-4, 5), AllReduceTiming(1024, 4e-4, 3e-4, 5e-4, 5)]
    assert MeasuredAllReduce.from_timings(timings, 2).seconds(520) == pytest.approx(3e-4)
    for bad, match in [({}, "at least one"), ({1: -1.0}, ">= 0"), ([(1, 1.0), (1, 2.0)], "one time")]:
        with pytest.raises(ValueError, match=match):
            MeasuredAllReduce(bad, 2)
    with pytest.raises(ValueError, match=">= 2 ranks"):
        MeasuredAllReduce({1: 1.0}, 1)


def test_measure_allreduce_times_gloo_between_two_processes():
    timings = measure_allreduce(2, [16, 4096], repeats=3, warmup=1, timeout_s=60)
    assert [t.nbytes for t in timings] == [16, 4096]
    for t in timings:
        assert 0 < t.p10_s <= t.median_s <= t.p90_s < 1.0 and t.repeats == 3
    assert MeasuredAllReduce.from_timings(timings, 2).seconds(16) == timings[0].median_s
    with pytest.raises(ValueError, match="backend"):
        measure_allreduce(2, [16], backend="mpi")


# -- one rank's shape ---------------------------------------------------------------------------
def test_llama3_8b_per_rank_kv_and_weights_by_hand(configs):
    cfg = AutoConfig.from_pretrained(configs["llama3_8b"])
    h, inter, vocab, layers = 4096, 14336, 128256, 32
    for tp in (1, 2, 4, 8, 16):
        shape = ModelShape.from_hf_config(cfg, tp)
        kv_heads = max(1, 8 // tp)  # 8 KV heads: split up to 8 ranks, then one replicated
        assert shape.num_kv_heads == kv_heads and shape.num_heads == 32 // tp
        assert shape.kv_bytes_per_token(2) == layers * 2 * kv_heads * 128 * 2
        # q and o: 32 / tp heads of 128; k and v: the rank's KV heads; gate, up, down: inter / tp
        per_layer = 2 * h * (32 // tp) * 128 + 2 * h * kv_heads * 128 + 3 * h * inter // tp
        params = (layers * (per_layer + 2 * h) + h  # + the norms, whole on every rank
                  + 2 * -(-vocab // tp) * h)  # embedding and LM head, vocab-parallel
        assert shape.num_params == params
        assert shape.weight_bytes(2) == 2 * params
    assert ModelShape.from_hf_config(cfg, 2).num_params == pytest.approx(8.03e9 / 2, rel=1e-3)
    with pytest.raises(ValueError, match="num_attention_heads=32 is not divisible by "
                                         "tensor_parallel_size=3"):
        ModelShape.from_hf_config(cfg, 3)


def test_deepseek_v3_per_rank_latent_cache_is_replicated_and_experts_split(configs):
    cfg = AutoConfig.from_pretrained(configs["deepseek_v3"])
    whole = ModelShape.from_hf_config(cfg)
    split = ModelShape.from_hf_config(cfg, 8)
    whole_experts = ModelShape.from_hf_config(cfg, 8, expert_parallel=True)
    for rank in (split, whole_experts):
        assert rank.kv_bytes_per_token(2) == whole.kv_bytes_per_token(2) == 61 * (512 + 64) * 2
        assert rank.num_heads == 16 and rank.q_lora_rank == whole.q_lora_rank  # q_a replicated
    assert (split.n_routed_experts, split.moe_intermediate_size) == (256, 2048 // 8)
    assert (whole_experts.n_routed_experts, whole_experts.moe_intermediate_size) == (32, 2048)
    assert whole_experts.num_experts_per_tok == 1  # 8 routed pairs a token over 8 ranks
    # either way a rank holds 1/8 of the experts' weights
    assert split.linear_params()[1] == whole_experts.linear_params()[1] == whole.linear_params()[1] // 8
    assert split.num_params == whole_experts.num_params
    assert whole.num_params / 8 < split.num_params < whole.num_params / 7.9  # replicated latents


# -- simulated runs ----------------------------------------------------------------------------
def test_sim_accepts_tensor_parallel():
    assert SimExecutor.supports_tensor_parallel
    SimExecutor.check_tensor_parallel(8)
    with pytest.raises(ValueError, match="executor=sim"):
        Executor.check_tensor_parallel(2)


def _recorded(engine) -> list[tuple[StepShape, float]]:
    """Wraps the executor's step_seconds to record (shape, seconds) per step."""
    ex, steps = engine.executor, []
    real = ex.step_seconds

    def record(sched, finishing=0, after_idle=False):
        steps.append((sched.shape, real(sched, finishing, after_idle)))
        return steps[-1][1]

    ex.step_seconds = record
    return steps


def test_tiny_llama_tp2_plans_twice_the_blocks_and_steps_add_the_collectives():
    knobs = {"gpu_memory_utilization": 0.001}  # 86 MB of a simulated H100: no block cap
    one = LLM("tiny_llama", executor="sim", **knobs)
    two = LLM("tiny_llama", executor="sim", tensor_parallel_size=2, **knobs)
    e1, e2 = one.engine, two.engine
    assert e2.kv_bytes_per_token * 2 == e1.kv_bytes_per_token
    assert e2.weight_bytes < 0.51 * e1.weight_bytes
    ex = e2.executor
    assert e2.num_blocks < ex._max_useful_blocks() and e1.num_blocks < ex._max_useful_blocks()
    assert 1.95 < e2.num_blocks / e1.num_blocks < 2.1
    steps = _recorded(e2)
    prompts = [[5 + i] * (3 + 7 * i) for i in range(6)]
    outs = two.generate(prompts, SamplingParams(max_tokens=5))
    assert all(len(o.outputs[0].token_ids) == 5 for o in outs)
    assert e2.clock.now() == pytest.approx(sum(t for _, t in steps))
    roof1, roof2 = e1.executor.step_time, ex.step_time
    overhead = roof2.overhead_s
    for shape, seconds in steps:
        compute, comm = roof2.predict(shape), ex.target.comm_seconds(shape)
        assert comm > 0 and seconds == compute + comm  # exactly: the term beside the compute
        assert compute - overhead == pytest.approx((roof1.predict(shape) - overhead) / 2,
                                                   rel=0.02)  # a rank's half of the work
        assert comm == step_comm_seconds(ex.target.model, ex.target.allreduce,
                                         ex.target.dtype_bytes, shape)


def test_step_comm_seconds_by_hand():
    shape = ModelShape(num_layers=3, hidden_size=8, vocab_size=5, num_heads=1, num_kv_heads=1,
                       head_dim=8, intermediate_size=4, tensor_parallel_size=2)
    ring = MeasuredAllReduce({0: 1.0, 1000: 2.0}, 2)  # 1 s + 1 ms per byte
    step = StepShape(num_tokens=10, num_prefill_reqs=1, num_decode_reqs=3)
    # 2 x 3 layers + the embedding: 7 all-reduces of 10 x 8 x 2 = 160 B (1.16 s each); the LM
    # head gathers 4 rows x 5 x 2 ranks fp32 = 160 B (as 80 B: 1.08 s); 4 int64 ids (1.032 s)
    assert step_comm_seconds(shape, ring, 2, step) == pytest.approx(7 * 1.16 + 1.08 + 1.032)
    assert step_comm_seconds(shape, ring, 2, StepShape()) == 0.0


class _FittedAtTP2(StepTimeModel):
    includes_comm = True

    def predict(self, shape):
        return 0.01


def test_a_model_that_includes_comm_gets_no_second_comm_term(configs, tmp_path):
    engine = LLM(str(configs["llama3_8b"]), executor="sim", tensor_parallel_size=2,
                 **{"sim/step_time": "constant"}).engine
    ex = engine.executor
    shape = StepShape(num_tokens=4, num_decode_reqs=4, decode_context_tokens=40)
    sched = type("Sched", (), {"shape": shape})()
    assert ex.step_seconds(sched) == 0.01 + ex.target.comm_seconds(shape)
    ex.step_time = _FittedAtTP2()
    assert ex.step_seconds(sched) == 0.01
    # a measured table (sim.allreduce=PATH) replaces the device's ring
    path = tmp_path / "allreduce.json"
    path.write_text(json.dumps(MeasuredAllReduce({1: 1e-3}, 2).to_dict()))
    measured = LLM(str(configs["llama3_8b"]), executor="sim", tensor_parallel_size=2,
                   **{"sim.allreduce": str(path)}).engine.executor.target
    assert isinstance(measured.allreduce, MeasuredAllReduce)
    assert measured.comm_seconds(shape) == pytest.approx((2 * 32 + 1) * 1e-3 + 2 * 1e-3)
    with pytest.raises(ValueError, match="all-reduce model of 2 ranks"):
        SimTarget(ModelShape.from_hf_config(AutoConfig.from_pretrained(configs["llama3_8b"]), 4),
                  DEVICES["h100"], 2, 2, 2, MeasuredAllReduce({1: 1e-3}, 2))


def test_tiny_deepseek_with_expert_parallel_runs():
    llm = LLM("tiny_deepseek", executor="sim", tensor_parallel_size=2, expert_parallel=True)
    outs = llm.generate([[5, 6, 7], [8, 9]], SamplingParams(max_tokens=3))
    assert all(len(o.outputs[0].token_ids) == 3 for o in outs)
    assert llm.engine.executor.target.model.expert_parallel


def test_run_py_llama3_8b_tp2_plans_one_ranks_memory(tmp_path, configs):
    cmd = ["run.py", "executor=sim", "model=hf",
           f"model.path={configs['llama3_8b']}", "tensor_parallel_size=2",
           "workload.num_requests=16", "logger=[jsonl]", f"hydra.run.dir={tmp_path}"]
    proc = run_python(cmd, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["num_finished"] == {"length": 16}
    assert summary["kv_bytes_per_token"] == 64 * 1024  # 4 of the 8 KV heads
    assert summary["weight_bytes"] == pytest.approx(8.03e9, rel=1e-3)  # half of 16.06 GB
    # one rank's H100: 0.9 x 80 GiB - its weights, less a small activation estimate
    expected = (0.9 * 80 * GiB - summary["weight_bytes"]) / (64 * 1024 * 16)
    assert 0.98 * expected < summary["num_kv_blocks"] <= expected
