"""`python run.py` end to end: progress, summary table, run directory with its statistics."""

import json
import subprocess
import sys
from pathlib import Path

import yaml

from lab.models.tiny import preset
from tests.procs import run_python

REPO = Path(__file__).resolve().parents[2]


def test_run_py_writes_statistics(tmp_path):
    # a fresh interpreter, as a user's `python run.py` (the other run.py tests fork one that
    # imported torch: tests/procs.py run_python)
    cmd = [sys.executable, "run.py", "workload.num_requests=12", "num_gpu_blocks=56",
           "block_size=4", "max_num_batched_tokens=64", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert f"run directory: {tmp_path}" in out
    assert "output tok/s" in out and "prefix-cache hit rate" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["num_requests"] == 12 and summary["num_rejected"] == 0
    setup = summary["setup"]  # what ran, in the summary's header and the console's first row
    assert setup["model"] == "tiny_llama" and setup["scheduler"] == "fcfs"
    assert setup["preemption"] == "recompute" and setup["quant"] == "none"
    assert {"dtype", "device", "attention", "kernels", "executor", "threads", "commit"} <= set(setup)
    assert "tiny_llama" in out and "scheduler fcfs" in out
    assert f"torch threads: {setup['threads']} of " in out  # said at start, and why
    assert "chosen by the defaults" not in out  # the model is the default one
    assert "KV cache: one request of the model's context" not in out  # num_gpu_blocks given
    requests = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    steps = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert len(requests) == 12 and len(steps) == summary["num_steps"]
    assert sum(r["num_output_tokens"] for r in requests) == summary["total_output_tokens"]
    assert sum(s["num_preempted"] for s in steps) == summary["num_preemptions"] > 0
    assert all(s["kv_blocks_used"] <= s["kv_blocks_total"] == 55 for s in steps)
    assert summary["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 4  # layers x K,V x heads x dim x fp32
    assert "bytes/token" in out
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert config["num_gpu_blocks"] == 56 and config["cache"]["block_size"] == 4


def test_run_py_design_card_command_on_the_embedded_deepseek(tmp_path):
    """The design card's `python run.py attention=triton_mla scheduler=priority preemption=swap
    quant=fp8` picks the embedded MLA + MoE model by itself and completes (Triton's interpreter
    on CPU; fp8 linears and 8-bit experts through the torch references), swapping under
    pressure."""
    # Short requests (Triton's interpreter runs every step) and a cache that holds ~2 of them.
    cmd = ["run.py", "attention=triton_mla", "scheduler=priority",
           "preemption=swap", "quant=fp8", "workload.num_requests=8", "workload.num_priorities=2",
           "workload.arrival=poisson", "workload.rate=100",
           "workload.prompt_len={dist: uniform, min: 12, max: 40}",
           "workload.output_len={dist: uniform, min: 4, max: 12}", "workload.prefix_len=8",
           "num_gpu_blocks=24", "block_size=4", "logger=[jsonl]", f"hydra.run.dir={tmp_path}"]
    proc = run_python(cmd, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert config["model"]["name"] == "tiny_deepseek"
    assert ("model: tiny_deepseek, chosen by the defaults of attention=triton_mla"
            in proc.stdout + proc.stderr)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["num_requests"] == 8 and summary["num_finished"] == {"length": 8}
    assert summary["num_preemptions"] > 0 and summary["swap_out_blocks"] > 0
    spec = preset("tiny_deepseek")  # one latent row (kv_lora_rank + rope dims) per token
    latent = spec["kv_lora_rank"] + spec["qk_rope_head_dim"]
    assert summary["kv_bytes_per_token"] == spec["num_hidden_layers"] * latent * 4  # fp32
    assert summary["num_kv_blocks"] == 23 and summary["kv_block_size"] == 4
    assert summary["weight_bytes"] > 0 and "quant=fp8" in proc.stdout + proc.stderr
