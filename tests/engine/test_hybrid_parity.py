"""Parity for the families whose layers use attention features (tiny_models("hybrid"): Mistral's
and Qwen2's sliding windows, Gemma-2's soft caps, Gemma-3's local / global layers, gpt-oss's
sinks): greedy ids of `LLM(attention="torch")` equal transformers' `generate` in the five modes
of tests/engine/parity_utils.py (ALL_MODES: default, chunked prefill, prefix-cache hits,
preemption by recompute and by swap). The prompts and their 24 new tokens outgrow every
preset's window several times. Inproc only: an mp core process runs the same model code, and
tests/engine/test_engine_parity.py checks that boundary.

Every mode runs over the hybrid KV cache (lab/cache/groups.py: sliding layers in their own KV
cache groups, freeing what leaves the window); the preemption modes get as many blocks per
group as the one-group cache of parity_utils (the same KV bytes: a block is one page per
layer of a group), and `test_hybrid_off_parity` runs the default mode with every layer in one
full-attention group (cache.hybrid=false)."""

import pytest
from transformers import AutoConfig

from lab.cache.groups import group_layers
from lab.models.registry import arch_spec
from lab.models.tiny import ensure_tiny_model
from tests.engine.parity_utils import (
    ALL_MODES,
    check_greedy_parity,
    hf_greedy_outputs,
    model_name_fixture,
)
from tests.options import tiny_models

MODELS = tiny_models("hybrid")
model_name = model_name_fixture(MODELS)


@pytest.fixture(scope="module")
def hf_outputs(model_name):
    return hf_greedy_outputs(model_name)


def num_groups(model_name: str) -> int:
    cfg = AutoConfig.from_pretrained(ensure_tiny_model(model_name))
    return len(group_layers(arch_spec(cfg).layer_attention_specs(cfg)))


@pytest.mark.parametrize("mode", list(ALL_MODES))
def test_hybrid_greedy_parity(model_name, hf_outputs, mode):
    knobs = {}
    if "num_gpu_blocks" in ALL_MODES[mode]:
        knobs["num_gpu_blocks"] = ALL_MODES[mode]["num_gpu_blocks"] * num_groups(model_name)
    check_greedy_parity(model_name, hf_outputs, mode, "inproc", attention="torch", **knobs)


def test_hybrid_off_parity(model_name, hf_outputs):
    check_greedy_parity(model_name, hf_outputs, "default", "inproc", attention="torch",
                        **{"cache.hybrid": False})
