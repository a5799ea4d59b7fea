"""Parity for DeepSeek (MLA + MoE): greedy ids of `LLM(model=tiny_deepseek*, attention="torch")`
equal transformers' `generate` for V2 (q_lora, group-limited routing), V2-Lite (no q_lora, greedy
routing) and V3 (sigmoid noaux_tc routing, interleaved rope), in the four modes of
tests/engine/parity_utils.py: default, chunked prefill, prefix-cache hits, preemption."""

import pytest

from tests.engine.parity_utils import MODES, check_greedy_parity, hf_greedy_outputs
from tests.options import tiny_models

MODELS = tiny_models("mla")


@pytest.fixture(scope="module", params=MODELS)
def model_name(request):
    return request.param


@pytest.fixture(scope="module")
def hf_outputs(model_name):
    return hf_greedy_outputs(model_name)


@pytest.mark.parametrize("mode", list(MODES))
def test_deepseek_greedy_parity(model_name, hf_outputs, mode):
    check_greedy_parity(model_name, hf_outputs, mode, attention="torch")
