"""A sliding-window model's window group holds only the window's blocks: serving prompts of 4x
the window, each request holds at most ceil(window / block_size) + 1 blocks of a sliding group
at every step once it is past the window (and decodes), while cache.hybrid=false keeps every
block of the context; both give the same tokens."""

from __future__ import annotations

import torch

from lab import LLM, SamplingParams
from lab.cache.groups import SLIDING_WINDOW

BS = 4
KNOBS = dict(dtype="float32", device="cpu", block_size=BS, max_num_seqs=4)


def _serve(model: str, **knobs) -> tuple[list[list[int]], int, dict[str, int]]:
    """(token ids, the config's window, the most blocks any request past its prompt held in
    each group at a step) for 4 prompts of 4x the window."""
    llm = LLM(model, **KNOBS, **knobs)
    engine = llm.engine
    kv = engine.scheduler.kv
    window = engine.hf_config.sliding_window
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 500, (4 * window,), generator=g).tolist() for _ in range(4)]
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
           for p in prompts]
    most, outputs = {}, {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id] = list(out.outputs[0].token_ids)
        for req in engine.scheduler.running:
            if req.num_computed_tokens <= req.num_prompt_tokens:
                continue  # still in its prefill
            for group, blocks in zip(kv.groups, kv.get_block_ids(req.request_id)):
                key = group.spec.describe()
                most[key] = max(most.get(key, 0), sum(1 for b in blocks if b != 0))
    engine.shutdown()
    return [outputs[i] for i in ids], window, most


def test_a_window_group_holds_the_window_and_one_block():
    tokens, window, most = _serve("tiny_mistral_sw")  # every layer slides (16 tokens)
    assert window == 16
    assert most == {f"{SLIDING_WINDOW}({window})": -(-window // BS) + 1}
    baseline, _, full = _serve("tiny_mistral_sw", **{"cache.hybrid": False})
    assert baseline == tokens
    assert full["full_attention"] >= 4 * window // BS  # the whole context, never freed


def test_a_hybrid_models_full_group_keeps_the_context():
    tokens, window, most = _serve("tiny_gpt_oss")  # sliding and full layers alternate
    assert most[f"{SLIDING_WINDOW}({window})"] == -(-window // BS) + 1
    assert most["full_attention"] >= 4 * window // BS


def test_step_stats_count_each_groups_blocks_and_the_window_frees():
    llm = LLM("tiny_gpt_oss", **KNOBS)
    llm.generate([list(range(3, 3 + 64))], SamplingParams(temperature=0, max_tokens=8))
    steps = list(llm.engine.recent_steps)
    llm.engine.shutdown()
    assert all(len(s.kv_blocks_used_per_group) == 2 for s in steps)
    assert all(sum(s.kv_blocks_used_per_group) == s.kv_blocks_used for s in steps)
    full, sliding = steps[0].kv_blocks_used_per_group  # the prompt's 16 blocks in each
    assert full == sliding == 64 // BS
    assert sum(s.num_window_freed_blocks for s in steps) >= 64 // BS - 5
