"""Parity for DeepSeek (MLA + MoE): greedy ids of `LLM(model=tiny_deepseek*, attention="torch")`
equal transformers' `generate` for V2 (q_lora, group-limited routing), V2-Lite (no q_lora, greedy
routing) and V3 (sigmoid noaux_tc routing, interleaved rope), in the four modes of
tests/engine/parity_utils.py: default, chunked prefill, prefix-cache hits, preemption; each
inproc, and the first model over mp too (one core process runs every mode's prompts)."""

import pytest

from tests.engine.parity_utils import (
    MODES,
    check_greedy_parity,
    mp_on_the_first_only,
    parity_fixtures,
)
from tests.options import tiny_models

MODELS = tiny_models("mla")
model_name, hf_outputs, mp_runs = parity_fixtures(MODELS, attention="torch")


@pytest.mark.parametrize("mode", list(MODES))
def test_deepseek_greedy_parity(model_name, hf_outputs, mode, engine_client, request):
    mp_on_the_first_only(engine_client, model_name, MODELS[0], "model code")
    runs = request.getfixturevalue("mp_runs") if engine_client == "mp" else None
    check_greedy_parity(model_name, hf_outputs, mode, engine_client, runs, attention="torch")
