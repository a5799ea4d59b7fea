"""Parity: greedy token ids through the engine equal transformers' `generate` on the same weights.

Each tiny model family is checked in four modes: default; chunked prefill with a budget smaller
than the prompts; prefix caching over shared prefixes (hits > 0); and a KV cache small enough
that preemption happens (preemptions > 0); each over both engine clients (inproc, and mp: one
core process per model runs every mode's prompts). The helpers live in
tests/engine/parity_utils.py.
"""

import pytest

from tests.engine.parity_utils import (
    MODES,
    check_greedy_parity,
    hf_greedy_outputs,
    mp_parity_runs,
)
from tests.options import tiny_models

MODELS = tiny_models("gqa")  # MLA models: test_deepseek_parity.py


@pytest.fixture(scope="module", params=MODELS)
def model_name(request):
    return request.param


@pytest.fixture(scope="module")
def hf_outputs(model_name):
    """transformers' greedy continuations, one prompt at a time (no padding effects)."""
    return hf_greedy_outputs(model_name)


@pytest.fixture(scope="module")
def mp_runs(model_name):
    """Every mode's prompts through one engine_client=mp core process (parity_utils)."""
    return mp_parity_runs(model_name)


@pytest.mark.parametrize("mode", list(MODES))
def test_greedy_parity(model_name, hf_outputs, mode, engine_client, request):
    runs = request.getfixturevalue("mp_runs") if engine_client == "mp" else None
    check_greedy_parity(model_name, hf_outputs, mode, engine_client, runs)
