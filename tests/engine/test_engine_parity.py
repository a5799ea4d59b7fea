"""Parity: greedy token ids through the engine equal transformers' `generate` on the same weights.

Each tiny model family is checked in four modes: default; chunked prefill with a budget smaller
than the prompts; prefix caching over shared prefixes (hits > 0); and a KV cache small enough
that preemption happens (preemptions > 0).
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from lab import LLM, SamplingParams
from lab.models.tiny import ensure_tiny_model

MODELS = ["tiny_llama", "tiny_qwen3", "tiny_qwen2"]
MAX_TOKENS = 24
MODES = {
    "default": dict(),
    "chunked": dict(max_num_batched_tokens=16),
    "prefix": dict(),
    "preempt": dict(num_gpu_blocks=24, block_size=4, max_model_len=64),
}


def _prompts(mode: str) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    lengths = [3, 9, 17, 30, 5, 38, 12, 21, 1, 26]
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in lengths]
    if mode == "prefix":
        shared = torch.randint(3, 500, (20,), generator=g).tolist()
        prompts = [shared + p for p in prompts]
    return prompts


@pytest.fixture(scope="module", params=MODELS)
def model_name(request):
    return request.param


@pytest.fixture(scope="module")
def hf_outputs(model_name):
    """transformers' greedy continuations, one prompt at a time (no padding effects)."""
    path = ensure_tiny_model(model_name)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = {}
    for mode in ("default", "prefix"):
        for p in _prompts(mode):
            ids = torch.tensor([p])
            gen = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False,
                                 attention_mask=torch.ones_like(ids))
            out[tuple(p)] = gen[0, len(p):].tolist()
    return out


@pytest.mark.parametrize("mode", list(MODES))
def test_greedy_parity(model_name, hf_outputs, mode):
    knobs = dict(dtype="float32", device="cpu", block_size=8) | MODES[mode]
    llm = LLM(model_name, **knobs)
    prompts = _prompts("prefix" if mode == "prefix" else "default")
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    for p, o in zip(prompts, outs):
        assert o.prompt_token_ids == p
        assert o.outputs[0].token_ids == hf_outputs[tuple(p)], f"prompt of {len(p)} tokens"
    steps = llm.engine.step_stats
    if mode == "prefix":
        assert sum(s.prefix_cache_hits for s in steps) > 0
    if mode == "preempt":
        assert sum(s.num_preempted for s in steps) > 0
    if mode == "chunked":
        assert max(s.num_scheduled_tokens for s in steps) <= 16
    kv = llm.engine.scheduler.kv
    assert kv.num_free_blocks == kv.num_blocks - 1
