"""The engine end to end with each quantization method: LLM(..., quant=...) and run.py quant=...
generate, and the engine reports the weight bytes after quantization."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from lab.core.sampling_params import SamplingParams
from lab.engine.llm import LLM
from lab.layers.linear import Linear
from tests.options import build, options
from tests.procs import run_python
from tests.quant.conftest import load, logits_of, tiny

REPO = Path(__file__).resolve().parents[2]
PROMPTS = ["The quick brown fox jumps over", "Once upon a time in a small village", "Paged attention"]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

# Every quant option with its defaults, plus variants of its knobs. Tiny models have hidden 64,
# so w4a16 runs with groups of 32 (its default 128 is refused there).
KNOBS = {"w4a16": {"group_size": 32}}
OPTIONS = {o: KNOBS.get(o, {}) for o in options("quant")} | {
    "fp8-tensor": {"weight_scheme": "per_tensor", "activation_scheme": "per_tensor"},
    "fp8-tensor-weights": {"weight_scheme": "per_tensor"},
    "w4a16-asym": {"group_size": 32, "symmetric": False},
}
# A per-tensor dynamic activation scale is the max over the whole step's batch, so tokens depend
# on what else is batched (and on prefill vs decode): only a lone prefill matches the reference.
BATCH_DEPENDENT = {"fp8-tensor"}


def make_llm(option: str, model: str = "tiny_llama", **extra) -> LLM:
    knobs = {f"quant.{k}": v for k, v in OPTIONS[option].items()}
    return LLM(model, quant=option.split("-")[0], num_gpu_blocks=64, kernels="torch", **knobs,
               **extra)


@functools.cache
def run(option: str, model: str = "tiny_llama"):
    llm = make_llm(option, model)
    outs = llm.generate(PROMPTS, GREEDY)
    return llm, [o.outputs[0].token_ids for o in outs], [o.prompt_token_ids for o in outs]


def reference_greedy(model, prompt_ids: list[int], n: int) -> list[int]:
    """Greedy decoding without the engine: the whole sequence recomputed every step, causal
    attention without a KV cache (DenseBackend), argmax of the last position."""
    ids = list(prompt_ids)
    for _ in range(n):
        ids.append(int(logits_of(model, ids)[-1].argmax()))
    return ids[len(prompt_ids):]


@pytest.mark.parametrize("option", list(OPTIONS))
def test_llm_generates_with_each_method(option):
    """The engine quantizes exactly as the quant config does outside it (the same quantized
    tensors, every Linear holding the config's method) and its greedy tokens equal a plain
    greedy loop over that quantized model."""
    llm, tokens, prompt_ids = run(option)
    engine = llm.engine
    config = build("quant", option.split("-")[0], **OPTIONS[option])
    ref = load(tiny("tiny_llama"), config)
    model = engine.executor.worker.model
    got, want = model.state_dict(), ref.state_dict()
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
    methods = {type(m.quant_method) for m in model.modules() if isinstance(m, Linear)}
    assert methods == {type(m.quant_method) for m in ref.modules() if isinstance(m, Linear)}
    assert len(methods) == 1
    print(f"\nquant={option}: weight bytes {engine.weight_bytes:,}, methods {methods}")
    if option in BATCH_DEPENDENT:  # each prompt's prefill alone (no prefix-cache hits)
        alone = make_llm(option, enable_prefix_caching=False)
        first = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        tokens = [alone.generate([p], first)[0].outputs[0].token_ids for p in prompt_ids]
    want = [reference_greedy(ref, p, len(tokens[0])) for p in prompt_ids]
    assert tokens == want


def test_weight_bytes_shrink():
    """Linear weights: fp32 4 B/param -> int8/fp8 1 B -> int4 0.5 B (+ scales); embeddings and
    lm_head stay fp32, so the totals shrink by less than the per-layer ratio."""
    size = {o: run(o)[0].engine.weight_bytes for o in OPTIONS}
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
    short = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)  # interpreter: 4 steps
    for kernels, experts in (("torch", "quantize"), ("triton", "quantize"), ("torch", "dense")):
        llm = LLM("tiny_deepseek", quant="int8", num_gpu_blocks=64, kernels=kernels,
                  **{"quant.experts": experts})
        runs[kernels, experts] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:2], short)]
    assert runs["triton", "quantize"] == runs["torch", "quantize"]
    assert all(len(ids) == 4 for ids in runs["torch", "dense"])


def test_run_py_with_quant(tmp_path):
    cmd = ["run.py", "quant=w4a16", "quant.group_size=32", "kernels=torch",
           "workload.num_requests=4", "num_gpu_blocks=64", "logger=[console,jsonl]",
           f"hydra.run.dir={tmp_path}"]
    proc = run_python(cmd, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "model weights:" in out and "quant=w4a16" in out
    summary = json.loads((tmp_path / "summary.json").read_text())  # the summary shows it too
    dense = LLM("tiny_llama", num_gpu_blocks=16).engine.weight_bytes
    assert 0 < summary["weight_bytes"] < dense
    assert "weights" in out
