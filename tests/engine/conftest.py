"""The `engine_client` fixture: a test that takes it runs over both engine clients, inproc (the
engine core in the test's process) and mp (the core in its own spawned process behind ZMQ;
its step statistics come back with the outputs, `llm.engine.recent_steps`). The engine parity
tests take it, so every one of them also checks the ids that cross from a core process."""

import pytest

ENGINE_CLIENTS = ["inproc", "mp"]


@pytest.fixture(params=ENGINE_CLIENTS)
def engine_client(request) -> str:
    return request.param
