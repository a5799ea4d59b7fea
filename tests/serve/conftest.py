"""The OpenAI-compatible server on tiny_llama, served by a real uvicorn in a thread: one per test
module (the fixtures are module-scoped), shared by test_api_server.py and test_fuzz_bodies.py."""

import socket
import threading
import time

import httpx
import pytest

from lab.engine.async_llm import AsyncLLM
from lab.engine.llm import LLM
from lab.serve.api_server import build_app

KW = dict(attention="torch", num_gpu_blocks=64, block_size=4, max_model_len=128)


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny_llama", **KW)


@pytest.fixture(scope="module")
def server(llm):
    """(base url, AsyncLLM) of a uvicorn serving `llm`'s engine; shut down after the module."""
    uvicorn = pytest.importorskip("uvicorn")
    async_llm = AsyncLLM(llm.engine)  # the same engine: outputs comparable token for token
    app = build_app(async_llm, "tiny_llama")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not srv.started and time.time() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}", async_llm
    srv.should_exit = True
    thread.join(10)
    async_llm.shutdown()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server[0], timeout=30) as c:
        yield c
