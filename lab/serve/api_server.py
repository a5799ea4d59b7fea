"""The OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions, /v1/models,
/health, /version, /metrics (the engine's `lab:` Prometheus metrics).

    app = build_app(AsyncLLM.from_config(cfg), "tiny_llama")   # in-process (tests)
    lab serve model=tiny_llama attention=torch --port 8000      # lab/cli.py

Streaming answers are server-sent events (`data: {json}\\n\\n`, then `data: [DONE]\\n\\n`). Bad
input is a 400 in OpenAI's error format naming the field, never a 500. A client that disconnects
mid-stream aborts its request (its KV blocks are freed).

One router per area, each reaching the engine through AsyncLLM's public API and the app's
ServerState (lab/serve/state.py): completions and chat (completions.py, answers shaped by
responses.py), models (models.py), health / version / metrics (system.py); the errors and their
handlers are errors.py's.
"""

from __future__ import annotations

from fastapi import FastAPI

from lab.core.sampling_params import MAX_N
from lab.engine.async_llm import AsyncLLM
from lab.serve import completions, models, system
from lab.serve.errors import add_exception_handlers
from lab.serve.state import ServerState, prometheus_of


def build_app(async_llm: AsyncLLM, model_name: str = "lab", *, max_n: int = MAX_N) -> FastAPI:
    """The FastAPI app serving `async_llm` under the model name `model_name`; a request asks
    for at most `max_n` completions (n)."""
    app = FastAPI(title="lab OpenAI-compatible server", version=system.lab_version())
    app.state.server = ServerState(async_llm, model_name, prometheus_of(async_llm, model_name),
                                   model_root=async_llm.model_path, max_n=max_n)
    add_exception_handlers(app)
    for router in (completions.router, models.router, system.router):
        app.include_router(router)
    return app
