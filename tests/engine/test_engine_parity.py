"""Parity: greedy token ids through the engine equal transformers' `generate` on the same weights.

Each tiny model family is checked in four modes: default; chunked prefill with a budget smaller
than the prompts; prefix caching over shared prefixes (hits > 0); and a KV cache small enough
that preemption happens (preemptions > 0); each inproc, and the first model over mp too (one
core process runs every mode's prompts). The helpers live in
tests/engine/parity_utils.py.
"""

import pytest

from tests.engine.parity_utils import (
    MODES,
    check_greedy_parity,
    mp_on_the_first_only,
    parity_fixtures,
)
from tests.options import tiny_models

MODELS = tiny_models("gqa")  # MLA models: test_deepseek_parity.py
model_name, hf_outputs, mp_runs = parity_fixtures(MODELS)


@pytest.mark.parametrize("mode", list(MODES))
def test_greedy_parity(model_name, hf_outputs, mode, engine_client, request):
    mp_on_the_first_only(engine_client, model_name, MODELS[0], "model code")
    runs = request.getfixturevalue("mp_runs") if engine_client == "mp" else None
    check_greedy_parity(model_name, hf_outputs, mode, engine_client, runs)
