"""Parity: greedy token ids through the engine equal transformers' `generate` on the same weights.

Each tiny model family is checked in four modes: default; chunked prefill with a budget smaller
than the prompts; prefix caching over shared prefixes (hits > 0); and a KV cache small enough
that preemption happens (preemptions > 0). The helpers live in tests/engine/parity_utils.py.
"""

import pytest

from tests.engine.parity_utils import MODES, check_greedy_parity, hf_greedy_outputs
from tests.options import tiny_models

MODELS = tiny_models("gqa")  # MLA models: test_deepseek_parity.py


@pytest.fixture(scope="module", params=MODELS)
def model_name(request):
    return request.param


@pytest.fixture(scope="module")
def hf_outputs(model_name):
    """transformers' greedy continuations, one prompt at a time (no padding effects)."""
    return hf_greedy_outputs(model_name)


@pytest.mark.parametrize("mode", list(MODES))
def test_greedy_parity(model_name, hf_outputs, mode):
    check_greedy_parity(model_name, hf_outputs, mode)


@pytest.mark.parametrize("mode", ["prefix", "preempt"])
def test_greedy_parity_through_the_mp_client(mode):
    """Prefix caching and preemption with the engine core in its own process
    (engine_client=mp), on the first GQA model; the modes' statistics come back with the
    outputs. (Two of the four modes: each mp engine costs a process start.)"""
    model = MODELS[0]
    check_greedy_parity(model, _hf(model), mode, engine_client="mp")


_HF_CACHE: dict = {}


def _hf(model: str) -> dict:
    if model not in _HF_CACHE:
        _HF_CACHE[model] = hf_greedy_outputs(model)
    return _HF_CACHE[model]
