"""The engine end to end with each quantization method: LLM(..., quant=...) and run.py quant=...
generate, and the engine reports the weight bytes after quantization."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab.engine.llm import LLM
from lab.layers.linear import Linear
from lab.sampling.params import SamplingParams

REPO = Path(__file__).resolve().parents[2]
PROMPTS = ["The quick brown fox jumps over", "Once upon a time in a small village", "Paged attention"]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

# quant option + its knobs (tiny models: hidden 64, so w4a16 groups of 32)
OPTIONS = {
    "none": {},
    "int8": {},
    "fp8": {},
    "fp8-tensor": {"quant.weight_scheme": "per_tensor", "quant.activation_scheme": "per_tensor"},
    "w4a16": {"quant.group_size": 32},
    "w4a16-asym": {"quant.group_size": 32, "quant.symmetric": False},
}


@functools.cache
def run(option: str, model: str = "tiny_llama"):
    llm = LLM(model, quant=option.split("-")[0], num_gpu_blocks=64, kernels="torch",
              **OPTIONS[option])
    outs = llm.generate(PROMPTS, GREEDY)
    return llm.engine, [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("option", list(OPTIONS))
def test_llm_generates_with_each_method(option):
    engine, tokens = run(option)
    assert [len(t) for t in tokens] == [8] * len(PROMPTS)
    model = engine.executor.worker.model
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    methods = {type(m.quant_method).__name__ for m in linears}
    print(f"\nquant={option}: weight bytes {engine.weight_bytes:,}, methods {methods}")
    assert len(methods) == 1


def test_weight_bytes_shrink():
    """Linear weights: fp32 4 B/param -> int8/fp8 1 B -> int4 0.5 B (+ scales); embeddings and
    lm_head stay fp32, so the totals shrink by less than the per-layer ratio."""
    size = {o: run(o)[0].weight_bytes for o in OPTIONS}
    print(f"\nweight bytes: {size}")
    assert size["w4a16"] < size["int8"] < size["none"]
    assert size["fp8"] == size["int8"]  # same layout: 1-byte weights + fp32 [N] scales
    assert size["fp8-tensor"] < size["fp8"] and size["w4a16"] < size["w4a16-asym"] < size["int8"]


def test_int8_greedy_mostly_agrees_with_unquantized():
    ref, q = run("none")[1], run("int8")[1]
    same = sum(a == b for r, t in zip(ref, q) for a, b in zip(r, t))
    print(f"\nint8 vs none: {same}/{8 * len(PROMPTS)} greedy tokens identical")
    assert same >= 0.5 * 8 * len(PROMPTS)


def test_deepseek_engine_with_8bit_experts():
    """quant=int8 quantizes the routed experts too (through the Triton fused MoE with int8
    weights under kernels=triton, matching the torch reference); quant.experts=refuse refuses
    them by name, quant.experts=dense keeps them dense."""
    with pytest.raises(ValueError, match="quant.experts=dense"):
        LLM("tiny_deepseek", quant="int8", num_gpu_blocks=64, kernels="torch",
            **{"quant.experts": "refuse"})
    runs = {}
    for kernels, experts in (("torch", "quantize"), ("triton", "quantize"), ("torch", "dense")):
        llm = LLM("tiny_deepseek", quant="int8", num_gpu_blocks=64, kernels=kernels,
                  **{"quant.experts": experts})
        runs[kernels, experts] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:2], GREEDY)]
    assert runs["triton", "quantize"] == runs["torch", "quantize"]
    assert all(len(ids) == 8 for ids in runs["torch", "dense"])


def test_run_py_with_quant(tmp_path):
    cmd = [sys.executable, "run.py", "quant=w4a16", "quant.group_size=32", "kernels=torch",
           "workload.num_requests=4", "num_gpu_blocks=64", "logger=[console,jsonl]",
           f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "model weights:" in out and "quant=w4a16" in out
    summary = json.loads((tmp_path / "summary.json").read_text())  # the summary shows it too
    dense = LLM("tiny_llama", num_gpu_blocks=16).engine.weight_bytes
    assert 0 < summary["weight_bytes"] < dense
    assert "weights" in out
