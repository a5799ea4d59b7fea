"""The OpenAI-compatible server on tiny_llama, served by a real uvicorn in a thread, once per
engine client: `inproc` (AsyncLLM steps the reference LLM's own engine in a thread) and
`async_mp` (lab serve's default: the core in its own process). Module-scoped, shared by
test_api_server.py and test_fuzz_bodies.py: every test there runs over both clients."""

import httpx
import pytest

from lab.config.compose import compose_config
from lab.engine.async_llm import AsyncLLM
from lab.engine.llm import LLM
from lab.serve.api_server import build_app
from lab.serve.limits import ServerLimits
from tests.serve.uvicorn_thread import serving
from tests.waits import WAIT_S

KW = dict(attention="torch", num_gpu_blocks=64, block_size=4, max_model_len=128)
MAX_N = 4  # the servers' max_n (a request asks for at most 4 completions)


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny_llama", **KW)


@pytest.fixture(scope="module", params=["inproc", "async_mp"])
def server(request, llm):
    """(base url, AsyncLLM) of a uvicorn serving tiny_llama; shut down after the module."""
    if request.param == "inproc":
        async_llm = AsyncLLM(llm.engine)  # the reference's own engine
    else:
        async_llm = AsyncLLM.from_config(compose_config(
            ["model=tiny_llama", "logger=[]", "engine_client=async_mp",
             *(f"{k}={v}" for k, v in KW.items())]))
    try:
        with serving(build_app(async_llm, "tiny_llama", ServerLimits(max_n=MAX_N))) as url:
            yield url, async_llm
    finally:
        async_llm.shutdown()


# a bound on a hung server, not on a busy machine (tests/waits.py)
CLIENT_TIMEOUT_S = WAIT_S


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server[0], timeout=CLIENT_TIMEOUT_S) as c:
        yield c
