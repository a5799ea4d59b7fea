"""The hybrid families on attention=triton_flash (Triton's interpreter without CUDA) and
attention=cpu: greedy ids equal transformers' over the hybrid KV cache, with chunked prefill,
prefix-cache hits and preemption in one engine per model and backend (tests/engine/
parity_utils.py's MP_KNOBS, its blocks as many as the groups need, over the prompts that
share a prefix: the longer ones are chunked, and they outgrow the cache).

By default only tiny_gemma2 on cpu runs (soft caps on every layer: attention=cpu's torch path;
~2 CPU-s); every other pair runs with `-m slow` (the interpreter costs ~25 CPU-s a model). The
default suite checks triton_flash over a hybrid cache in tests/worker/test_cudagraph.py
(tiny_gpt_oss: both groups, sinks, past the window, the token ids of attention=torch, decode
metadata built once per padded size) and its kernels against their references
(tests/kernels)."""

from __future__ import annotations

import pytest

from tests.engine.parity_utils import MP_KNOBS, hf_greedy_outputs, run_parity
from tests.options import tiny_models

DEFAULT = {("cpu", "tiny_gemma2")}
CASES = [pytest.param(attention, model, id=f"{attention}-{model}",
                      marks=() if (attention, model) in DEFAULT else pytest.mark.slow)
         for attention in ("triton_flash", "cpu") for model in tiny_models("hybrid")]


@pytest.mark.parametrize(("attention", "model"), CASES)
def test_hybrid_backend_parity(attention, model):
    hf = hf_greedy_outputs(model)
    run = run_parity(model, ["prefix"], attention=attention, **MP_KNOBS)["prefix"]
    for prompt, ids in zip(run.prompts, run.token_ids):
        assert ids == hf[tuple(prompt)], f"prompt of {len(prompt)} tokens"
    steps = run.steps
    assert sum(s.prefix_cache_hits for s in steps) > 0
    assert sum(s.num_preempted for s in steps) > 0
    assert max(s.num_scheduled_tokens for s in steps) <= MP_KNOBS["max_num_batched_tokens"]
    assert sum(s.num_window_freed_blocks for s in steps) > 0
