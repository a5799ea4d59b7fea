"""GET /health, /version and /metrics: is the engine alive, which lab, and the live engine's
`lab:` Prometheus metrics."""

from __future__ import annotations

import asyncio
from importlib.metadata import PackageNotFoundError, version

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from lab.engine.core import EngineDeadError
from lab.serve.state import State

router = APIRouter(tags=["system"])

#: how long /metrics waits for the core's state
STATUS_WAIT_S = 1.0

#: the Prometheus text exposition format's content type
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def lab_version() -> str:
    """The installed lab's version (0.1.0 when run from a tree that was never installed)."""
    try:
        return version("lab")
    except PackageNotFoundError:
        return "0.1.0"


@router.get("/health")
async def health(state: State) -> PlainTextResponse:
    """200 while the engine serves, 503 once it is dead or shut down."""
    ok = state.async_llm.is_healthy
    return PlainTextResponse("" if ok else "engine dead", status_code=200 if ok else 503)


@router.get("/version")
async def server_version() -> dict:
    return {"version": lab_version()}


@router.get("/metrics")
async def metrics(state: State) -> PlainTextResponse:
    """The metrics, the scheduler gauges refreshed from the core's state now (within
    STATUS_WAIT_S; else as the last step left them)."""
    if state.async_llm.is_healthy:
        try:
            status = await asyncio.wait_for(state.async_llm.get_status(), STATUS_WAIT_S)
            state.prometheus.on_status(status)
        except (TimeoutError, EngineDeadError):
            pass
    return PlainTextResponse(state.prometheus.exposition(), media_type=PROMETHEUS_TEXT)
