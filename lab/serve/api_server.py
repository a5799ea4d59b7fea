"""The OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions, /v1/models,
/health, /version, /metrics (the engine's `lab:` Prometheus metrics).

    app = build_app(AsyncLLM.from_config(cfg), "tiny_llama")   # in-process (tests)
    lab serve model=tiny_llama attention=torch --port 8000      # lab/cli.py

Streaming answers are server-sent events (`data: {json}\\n\\n`, then `data: [DONE]\\n\\n`). Bad
input is a 400 in OpenAI's format naming the field, never a 500. A client that disconnects
aborts its request (its KV blocks are freed), streaming or not.

One router per area, each reaching the engine through AsyncLLM's public API and the app's
ServerState (lab/serve/state.py): completions and chat (completions.py, answers shaped by
responses.py), models (models.py), health / version / metrics (system.py); the errors and their
handlers are errors.py's; what is let in at all (API key, body size, requests in flight) is
limits.py's.

While the app runs, a watch notices the engine's death (a dead or hung core) and calls
`on_engine_death` once: `lab serve` then shuts down and exits non-zero, as vLLM does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI

from lab.engine.async_llm import AsyncLLM
from lab.serve import completions, models, system
from lab.serve.errors import add_exception_handlers
from lab.serve.limits import ServerLimits, add_limits
from lab.serve.state import ServerState, prometheus_of

log = logging.getLogger(__name__)

#: how often the death watch looks at the engine
WATCH_S = 0.2


def build_app(async_llm: AsyncLLM, model_name: str = "lab",
              limits: ServerLimits | None = None,
              on_engine_death: Callable[[str], None] | None = None) -> FastAPI:
    """The FastAPI app serving `async_llm` under the model name `model_name`, admitting what
    `limits` allow (default: ServerLimits()); `on_engine_death(reason)` is called once if
    the engine dies."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await async_llm.start()
        watch = asyncio.ensure_future(_watch_engine(async_llm, on_engine_death))
        try:
            yield
        finally:
            watch.cancel()

    app = FastAPI(title="lab OpenAI-compatible server", version=system.lab_version(),
                  lifespan=lifespan)
    limits = limits or ServerLimits()
    app.state.server = ServerState(async_llm, model_name, prometheus_of(async_llm, model_name),
                                   model_root=async_llm.model_path, limits=limits)
    add_exception_handlers(app)
    add_limits(app, limits)
    for router in (completions.router, models.router, system.router):
        app.include_router(router)
    return app


async def _watch_engine(async_llm: AsyncLLM,
                        on_death: Callable[[str], None] | None) -> None:
    """Wait for the engine to turn unhealthy; report it (and call `on_death`) once."""
    while async_llm.is_healthy:
        await asyncio.sleep(WATCH_S)
    reason = async_llm.death_reason()
    log.error("the engine is dead (%s)%s", reason,
              "" if on_death is None else ": shutting the server down")
    if on_death is not None:
        on_death(reason)
