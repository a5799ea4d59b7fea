"""A non-streaming answer is computed only while its client waits (vLLM's `with_cancellation`).

A streamed answer stops by itself when its client leaves (Starlette stops the stream, which
aborts the request). A plain JSON answer has nothing to write until the request finished, so
without a watch a client that gave up would keep the engine busy to the end:

    result = await unless_disconnected(request, collect(stream))
    if result is CLIENT_GONE: ...        # collect() was cancelled (its request aborted)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")

CLIENT_GONE = object()
"""What unless_disconnected returns when the client left first."""


async def wait_for_disconnect(request: Request) -> None:
    """Return once the client has disconnected (the body was read already: the next ASGI
    message a server sends is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T | object:
    """`await work`, unless the client disconnects first: then `work` is cancelled (its
    cleanup aborts the request) and CLIENT_GONE is returned."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
    if task.cancelled() or not task.done():
        return CLIENT_GONE
    return task.result()
