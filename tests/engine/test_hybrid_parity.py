"""Parity for the families whose layers use attention features (tiny_models("hybrid"): Mistral's
and Qwen2's sliding windows, Gemma-2's soft caps, Gemma-3's local / global layers, gpt-oss's
sinks): greedy ids of `LLM(attention="torch")` equal transformers' `generate` in the five modes
of tests/engine/parity_utils.py (ALL_MODES: default, chunked prefill, prefix-cache hits,
preemption by recompute and by swap). The prompts and their 24 new tokens outgrow every
preset's window several times. Inproc only: an mp core process runs the same model code, and
tests/engine/test_engine_parity.py checks that boundary."""

import pytest

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


@pytest.mark.parametrize("mode", list(ALL_MODES))
def test_hybrid_greedy_parity(model_name, hf_outputs, mode):
    check_greedy_parity(model_name, hf_outputs, mode, "inproc", attention="torch")
