"""Parity for the families whose layers use attention features (tiny_models("hybrid"): Mistral's
and Qwen2's sliding windows, Gemma-2's soft caps, Gemma-3's local / global layers, gpt-oss's
sinks): greedy ids of `LLM(attention="torch")` equal transformers' `generate` in the modes of
tests/engine/parity_utils.py: default; chunked prefill, prefix-cache hits and preemption by
recompute in one engine (MP_KNOBS, both prompt sets: each effect checked); preemption by swap
(SWAP_MODELS: the presets whose KV cache groups are laid out differently).
The prompts and their 24 new tokens outgrow every preset's window several times. Inproc only:
an mp core process runs the same model code, and tests/engine/test_engine_parity.py checks
that boundary.

Every mode runs over the hybrid KV cache (lab/cache/groups.py: sliding layers in their own KV
cache groups, freeing what leaves the window), with blocks enough for one request of
max_model_len over every group and two to spare in the preemption modes (`blocks_for_groups`);
`test_hybrid_off_parity` runs the default mode of tiny_gpt_oss with every layer in one
full-attention group (cache.hybrid=false; tests/engine/test_window_blocks.py compares the two
modes' tokens on tiny_mistral_sw)."""

import pytest

from tests.engine.parity_utils import (
    MP_KNOBS,
    check_greedy_parity,
    hf_greedy_outputs,
    model_name_fixture,
    run_parity,
)
from tests.options import tiny_models

MODELS = tiny_models("hybrid")
model_name = model_name_fixture(MODELS)


@pytest.fixture(scope="module")
def hf_outputs(model_name):
    return hf_greedy_outputs(model_name)


# swap's two layouts: one sliding group (Mistral), full + sliding groups (gpt-oss), and a window
# that is not a whole number of blocks over six groups (Gemma-3)
SWAP_MODELS = ("tiny_mistral_sw", "tiny_gpt_oss", "tiny_gemma3")


def test_hybrid_default_parity(model_name, hf_outputs):
    check_greedy_parity(model_name, hf_outputs, "default", "inproc", attention="torch")


def test_hybrid_swap_parity(model_name, hf_outputs):
    if model_name not in SWAP_MODELS:
        pytest.skip(f"swap's layouts are those of {', '.join(SWAP_MODELS)}")
    check_greedy_parity(model_name, hf_outputs, "swap", "inproc", attention="torch")


def test_hybrid_chunked_prefix_preempt_parity(model_name, hf_outputs):
    runs = run_parity(model_name, ["default", "prefix"], attention="torch", **MP_KNOBS)
    for run in runs.values():
        for prompt, ids in zip(run.prompts, run.token_ids):
            assert ids == hf_outputs[tuple(prompt)], f"prompt of {len(prompt)} tokens"
    steps = [s for run in runs.values() for s in run.steps]
    assert max(s.num_scheduled_tokens for s in steps) <= MP_KNOBS["max_num_batched_tokens"]
    assert sum(s.prefix_cache_hits for s in runs["prefix"].steps) > 0
    assert sum(s.num_preempted for s in steps) > 0


def test_hybrid_off_parity(model_name, hf_outputs):
    if model_name != "tiny_gpt_oss":
        pytest.skip("one full-attention group is the one-group path every other family runs")
    check_greedy_parity(model_name, hf_outputs, "default", "inproc", attention="torch",
                        **{"cache.hybrid": False})
