"""Shared helpers of the engine parity tests: greedy token ids through `LLM` must equal
transformers' `generate` on the same weights, in four modes: default; chunked prefill with a
budget smaller than the prompts; prefix caching over shared prefixes (hits > 0); and a KV cache
small enough that preemption happens (preemptions > 0)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from lab import LLM, SamplingParams
from lab.models.tiny import ensure_tiny_model

MAX_TOKENS = 24
MODES = {
    "default": dict(),
    "chunked": dict(max_num_batched_tokens=16),
    # blocks are shared once computed (after their step): admit a few at a time so later
    # prompts find the shared prefix of earlier ones
    "prefix": dict(max_num_seqs=3),
    "preempt": dict(num_gpu_blocks=24, block_size=4, max_model_len=64),
}


def parity_prompts(mode: str) -> list[list[int]]:
    """Ten prompts of 1..38 tokens; in "prefix" mode each starts with the same 20 tokens."""
    g = torch.Generator().manual_seed(7)
    lengths = [3, 9, 17, 30, 5, 38, 12, 21, 1, 26]
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in lengths]
    if mode == "prefix":
        shared = torch.randint(3, 500, (20,), generator=g).tolist()
        prompts = [shared + p for p in prompts]
    return prompts


def hf_greedy_outputs(model_name: str) -> dict[tuple[int, ...], list[int]]:
    """transformers' greedy continuations of every parity prompt, one prompt at a time (no
    padding effects), keyed by the prompt."""
    path = ensure_tiny_model(model_name)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = {}
    for mode in ("default", "prefix"):
        for p in parity_prompts(mode):
            ids = torch.tensor([p])
            gen = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False,
                                 attention_mask=torch.ones_like(ids))
            out[tuple(p)] = gen[0, len(p):].tolist()
    return out


def check_greedy_parity(model_name: str, hf_outputs: dict, mode: str, **knobs) -> None:
    """Run the mode's prompts through LLM (fp32, CPU, block_size 8 + the mode's knobs + `knobs`)
    and assert the ids equal transformers' and the mode's effect happened."""
    knobs = dict(dtype="float32", device="cpu", block_size=8) | MODES[mode] | knobs
    llm = LLM(model_name, **knobs)
    prompts = parity_prompts("prefix" if mode == "prefix" else "default")
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    for p, o in zip(prompts, outs):
        assert o.prompt_token_ids == p
        assert o.outputs[0].token_ids == hf_outputs[tuple(p)], f"prompt of {len(p)} tokens"
    steps = llm.engine.recent_steps
    if mode == "prefix":
        assert sum(s.prefix_cache_hits for s in steps) > 0
    if mode == "preempt":
        assert sum(s.num_preempted for s in steps) > 0
    if mode == "chunked":
        assert max(s.num_scheduled_tokens for s in steps) <= 16
    if knobs.get("engine_client") == "mp":  # the cache lives in the core process
        llm.engine.shutdown()
        return
    kv = llm.engine.scheduler.kv
    assert kv.num_free_blocks == kv.num_blocks - 1
