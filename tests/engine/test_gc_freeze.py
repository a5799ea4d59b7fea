"""Once started, the engine core freezes the heap it was built with out of the cyclic GC (as
vLLM's EngineCore does: a full collection while serving would otherwise walk the model, the
compiled graphs and every imported module again); shutdown() hands it back, so an engine
dropped in-process can be collected."""

import gc

import pytest

from lab.config.compose import compose_config
from lab.core.sampling_params import SamplingParams
from lab.engine.llm_engine import LLMEngine


def _engine() -> LLMEngine:
    return LLMEngine(compose_config(["executor=sim", "sim/step_time=constant", "logger=[]",
                                     "model=tiny_llama"]))


@pytest.mark.gc_freeze
def test_a_started_engine_runs_on_a_frozen_heap_until_shutdown():
    gc.unfreeze()
    engine = _engine()
    try:
        assert gc.get_freeze_count() > 0  # the weights, the scheduler, the modules: frozen
        engine.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=3))
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        engine.shutdown()
    assert gc.get_freeze_count() == 0

