"""What every route of a server reaches: the AsyncLLM it serves, the served model's name and
checkpoint directory, when the server started, the Prometheus metrics /metrics exposes, and the
server's limits on requests. One `ServerState` per app, in `app.state.server`; a route takes it
as a dependency:

    @router.get("/v1/models")
    async def models(state: State) -> dict: ...
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from lab.engine.async_llm import AsyncLLM
from lab.metrics.prometheus import PrometheusLogger
from lab.serve.limits import ServerLimits


@dataclass(frozen=True)
class ServerState:
    """The engine a server serves, under which name, its metrics, and the server's limits."""

    async_llm: AsyncLLM
    model_name: str
    prometheus: PrometheusLogger
    created: int = field(default_factory=lambda: int(time.time()))
    # /v1/models' `root`: the checkpoint directory, as vLLM gives it (clients such as
    # `vllm bench serve` load their tokenizer from it); "" for the served name
    model_root: str = ""
    # what the server admits (lab/serve/limits.py); a route reads max_n
    limits: ServerLimits = field(default_factory=ServerLimits)


def prometheus_of(async_llm: AsyncLLM, model_name: str) -> PrometheusLogger:
    """The engine's PrometheusLogger (`logger=[prometheus]`), else a new one (no text file)
    added to its loggers: /metrics shows the live engine either way."""
    for logger in async_llm.stat_loggers:
        if isinstance(logger, PrometheusLogger):
            return logger
    logger = PrometheusLogger(model_name, textfile=None)
    async_llm.add_stat_logger(logger)
    return logger


def server_state(request: Request) -> ServerState:
    """The app's ServerState (a FastAPI dependency)."""
    return request.app.state.server


State = Annotated[ServerState, Depends(server_state)]
