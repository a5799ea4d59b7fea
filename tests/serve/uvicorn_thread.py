"""Serve a FastAPI app with a real uvicorn in a daemon thread, on a free local port; ask the
served AsyncLLM's core for its status from the test's thread."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def serving(app) -> Iterator[str]:
    """Yield the base URL while uvicorn serves `app`; stop it after."""
    uvicorn = pytest.importorskip("uvicorn")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def status_of(async_llm):
    """The core's CoreStatus, asked from this thread: on the server's loop (async_mp), or on
    a loop of our own (the thread driver serves any loop)."""
    loop = async_llm.event_loop
    if loop is None:
        return asyncio.run(async_llm.get_status())
    return asyncio.run_coroutine_threadsafe(async_llm.get_status(), loop).result(10)


def wait_idle(async_llm, timeout: float = 20.0):
    """The core's status once it holds no request (aborts reach it asynchronously)."""
    deadline = time.monotonic() + timeout
    while (status := status_of(async_llm)).num_requests and time.monotonic() < deadline:
        time.sleep(0.05)
    return status
