"""`executor=sim` end to end: through `LLM(...)` and `python run.py`, on the embedded tiny models
and on config-only directories of real models; outputs end by max_tokens on a virtual clock."""

import json
from pathlib import Path

import pytest

from lab import LLM, SamplingParams
from lab.clock import VirtualClock
from lab.executor.sim import SimExecutor
from lab.sim.configs import write_configs
from tests.procs import run_python

REPO = Path(__file__).resolve().parents[2]
GiB = 2**30


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    return write_configs(tmp_path_factory.mktemp("configs"))


def test_llm_with_executor_sim_generates_to_max_tokens_on_a_virtual_clock():
    llm = LLM("tiny_llama", executor="sim", **{"sim/step_time": "constant"})
    engine = llm.engine
    assert isinstance(engine.executor, SimExecutor) and isinstance(engine.clock, VirtualClock)
    eos = engine.eos_token_id
    stops = list(range(3, 500))  # almost every id stops: the rule must avoid all of them
    sp = SamplingParams(temperature=0, max_tokens=9, stop_token_ids=stops)
    outs = llm.generate([[5, 6, 7], [8, 9, 10, 11], "hello there"], sp)
    for out in outs:
        tokens = out.outputs[0].token_ids
        assert len(tokens) == 9 and out.outputs[0].finish_reason == "length"
        assert eos not in tokens and not set(tokens) & set(stops)
    assert outs[2].outputs[0].text  # tiny_llama has a tokenizer: text comes back
    # 9 tokens, the first in the prefill step: 9 steps of 0.01 s (sim.step_time.seconds)
    assert engine.clock.now() == pytest.approx(0.09)
    again = LLM("tiny_llama", executor="sim").generate([[5, 6, 7]], sp)
    assert again[0].outputs[0].token_ids == outs[0].outputs[0].token_ids  # deterministic


def test_sim_on_the_cpu_plans_the_real_cpu_workers_cache():
    one = {"cpu_kv_cache_requests": 1}  # one request of the context: 2048 / 16 + the null block
    real = LLM("tiny_llama", device="cpu", **one).engine
    sim = LLM("tiny_llama", executor="sim", **{"sim.device": "cpu"}, **one).engine
    assert sim.num_blocks == real.num_blocks == 129
    assert sim.model_info.bytes_per_block == real.model_info.bytes_per_block
    assert sim.weight_bytes == real.weight_bytes  # fp32 on the simulated cpu, as on the real one


def test_llama3_8b_on_a_simulated_h100_plans_a_realistic_cache(configs):
    engine = LLM(str(configs["llama3_8b"]), executor="sim", **{"sim.device": "h100"}).engine
    per_token = 32 * 8 * 128 * 2 * 2  # layers x KV heads x head dim x K,V x bf16
    assert engine.kv_bytes_per_token == per_token == 128 * 1024
    assert engine.weight_bytes == pytest.approx(16.06e9, rel=1e-3)  # 8.03B params in bf16
    expected = (80 * GiB * 0.9 - engine.weight_bytes) / (per_token * 16)
    assert 0.98 * expected < engine.num_blocks <= expected  # less a small activation estimate
    assert engine.tokenizer is None  # config only: prompts are token ids
    with pytest.raises(ValueError, match="no tokenizer"):
        engine.add_request("hello")
    outs = LLM(str(configs["llama3_8b"]), executor="sim").generate(
        [[1000 + i for i in range(300)]], SamplingParams(max_tokens=4))
    assert len(outs[0].outputs[0].token_ids) == 4


def test_fp8_kv_cache_and_quantized_weights_shrink_the_simulated_model(configs):
    base = LLM(str(configs["llama3_8b"]), executor="sim").engine
    fp8 = LLM(str(configs["llama3_8b"]), executor="sim", quant="fp8",
              **{"cache.dtype": "fp8"}).engine
    assert fp8.kv_bytes_per_token == base.kv_bytes_per_token // 2
    assert fp8.weight_bytes < 0.6 * base.weight_bytes
    assert fp8.num_blocks > 2 * base.num_blocks


def test_deepseek_v3_does_not_fit_one_simulated_h100(configs):
    with pytest.raises(RuntimeError, match="no memory left for the KV cache on the simulated h100"):
        LLM(str(configs["deepseek_v3"]), executor="sim")
    engine = LLM(str(configs["deepseek_v3"]), executor="sim", num_gpu_blocks=64).engine
    assert engine.kv_bytes_per_token == 61 * (512 + 64) * 2  # MLA latent rows, bf16
    assert 0.66e12 < engine.weight_bytes < 0.70e12  # an fp8 checkpoint: 1 byte per linear weight


def test_run_py_executor_sim(tmp_path):
    cmd = ["run.py", "executor=sim", "sim/step_time=constant",
           "sim.step_time.seconds=0.02", "workload.num_requests=24", "num_gpu_blocks=40",
           "logger=[jsonl]", f"hydra.run.dir={tmp_path}"]
    proc = run_python(cmd, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["num_requests"] == 24 and summary["num_finished"] == {"length": 24}
    assert summary["num_preemptions"] > 0  # 39 blocks of 16 tokens: the batch preempts
    steps = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert summary["wall_time"] == pytest.approx(0.02 * len(steps))  # the virtual clock
    assert all(s["execute_time"] == pytest.approx(0.02) for s in steps)
    assert all(s["schedule_time"] == 0 and s["update_time"] == 0 for s in steps)


def test_run_py_executor_sim_on_a_config_only_model(tmp_path, configs):
    cmd = ["run.py", "executor=sim", "model=hf",
           f"model.path={configs['llama3_8b']}", "sim.device=h200", "workload=poisson",
           "workload.num_requests=40", "logger=[jsonl]", f"hydra.run.dir={tmp_path}"]
    proc = run_python(cmd, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["num_finished"] == {"length": 40}
    assert summary["kv_bytes_per_token"] == 128 * 1024
    assert 1e-3 < summary["tpot_p50"] < 0.05  # milliseconds per token on a simulated H200
