"""Parity for DeepSeek (MLA + MoE): greedy ids of `LLM(model=tiny_deepseek*, attention="torch")`
equal transformers' `generate` for V2 (q_lora, group-limited routing), V2-Lite (no q_lora, greedy
routing) and V3 (sigmoid noaux_tc routing, interleaved rope), in the four modes of
tests/engine/parity_utils.py: default, chunked prefill, prefix-cache hits, preemption; each over
both engine clients (inproc, and mp: one core process per model runs every mode's prompts)."""

import pytest

from tests.engine.parity_utils import (
    MODES,
    check_greedy_parity,
    hf_greedy_outputs,
    mp_parity_runs,
)
from tests.options import tiny_models

MODELS = tiny_models("mla")


@pytest.fixture(scope="module", params=MODELS)
def model_name(request):
    return request.param


@pytest.fixture(scope="module")
def hf_outputs(model_name):
    return hf_greedy_outputs(model_name)


@pytest.fixture(scope="module")
def mp_runs(model_name):
    """Every mode's prompts through one engine_client=mp core process (parity_utils)."""
    return mp_parity_runs(model_name, attention="torch")


@pytest.mark.parametrize("mode", list(MODES))
def test_deepseek_greedy_parity(model_name, hf_outputs, mode, engine_client, request):
    runs = request.getfixturevalue("mp_runs") if engine_client == "mp" else None
    check_greedy_parity(model_name, hf_outputs, mode, engine_client, runs, attention="torch")
