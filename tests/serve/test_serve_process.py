"""A real `lab serve` process driven over HTTP, as a user's client drives it: the API key, body
and concurrency limits, a non-streaming client that leaves, SIGTERM, and the engine's death.

One server serves the first tests (slow steps, so a test can act mid-request); the last ones end
their own server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from lab.bench.server_process import ServerProcess, free_port, metric
from tests.procs import short_tmp_dir
from tests.waits import WAIT_S

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
ENGINE = ["model=tiny_llama", "attention=torch", "num_gpu_blocks=64", "block_size=4",
          "max_model_len=128", "executor._target_=tests.serve.flaky_executor.FlakyExecutor"]
LONG = {"prompt": "Hello there", "max_tokens": 100, "ignore_eos": True}


def server(*extra: str, step_s: float = 0.05, env: dict | None = None, **kw) -> ServerProcess:
    """A lab serve process whose steps take at least `step_s` (run from the repository, so the
    test executor imports in its core process)."""
    return ServerProcess([*ENGINE, f"+executor.min_step_s={step_s}", *extra], env=env, cwd=REPO,
                         **kw)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    """The shared server; its loggers write to `s.run_dir`, its core's IPC sockets live in
    `s.tmp`. The SIGTERM test, the last to use it, ends it."""
    root = tmp_path_factory.mktemp("served")
    with short_tmp_dir() as tmp, server(
            "--api-key", KEY, "--max-body-bytes", "65536", "--max-concurrent-requests", "3",
            "logger=[jsonl]", "--run-dir", str(root / "run"), "--shutdown-timeout", "1",
            env={"TMPDIR": str(tmp)}) as s:
        s.run_dir, s.tmp = root / "run", tmp
        yield s


# -- access -------------------------------------------------------------------------------------
def test_v1_needs_the_api_key_and_health_does_not(srv):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.get(srv.url + "/v1/models", headers=headers)
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "AuthenticationError"
        assert r.json()["error"]["code"] == 401
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 401
    assert httpx.get(srv.url + "/health").status_code == 200
    assert httpx.get(srv.url + "/v1/models", headers=AUTH).status_code == 200


def test_the_openai_client_with_the_key(srv):
    openai = pytest.importorskip("openai")
    good = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY)
    out = good.completions.create(model="tiny_llama", prompt="Hello", max_tokens=3)
    assert out.usage.completion_tokens == 3
    bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="tiny_llama", prompt="Hello", max_tokens=3)


# -- limits -------------------------------------------------------------------------------------
def test_an_oversized_body_is_refused_before_parsing(srv):
    big = json.dumps({"prompt": "x " * 40_000, "max_tokens": 1}).encode()
    r = httpx.post(srv.url + "/v1/completions", content=big,
                   headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"]["param"] == "body" and "65536" in r.json()["error"]["message"]

    def chunks():  # no Content-Length: counted as it comes
        for i in range(0, len(big), 8192):
            yield big[i:i + 8192]

    r = httpx.post(srv.url + "/v1/completions", content=chunks(),
                   headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 413
    ok = httpx.post(srv.url + "/v1/completions", headers=AUTH,
                    json={"prompt": "Hello", "max_tokens": 2})
    assert ok.status_code == 200


def test_requests_beyond_the_concurrency_limit_get_429(srv):
    with httpx.Client(base_url=srv.url, headers=AUTH, timeout=WAIT_S) as c:
        streams = [c.stream("POST", "/v1/completions", json=LONG | {"stream": True})
                   for _ in range(3)]
        opened = [s.__enter__() for s in streams]
        try:
            assert all(r.status_code == 200 for r in opened)
            r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert r.status_code == 429 and r.json()["error"]["type"] == "TooManyRequestsError"
        finally:
            for s in streams:
                s.__exit__(None, None, None)
        deadline = time.monotonic() + WAIT_S
        while (r := c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})) \
                .status_code == 429 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert r.status_code == 200


# -- a client that leaves -----------------------------------------------------------------------
def test_a_plain_request_stops_generating_when_its_client_leaves(srv):
    """n=4 x 100 tokens at >= 50 ms a step would run >= 5 s; the client leaves after 1 s: the
    tokens generated stop growing and the KV cache empties."""
    before = metric(srv.url, "generation_tokens_total")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.url + "/v1/completions", headers=AUTH, json=LONG | {"n": 4}, timeout=1.0)
    time.sleep(1.0)
    settled = metric(srv.url, "generation_tokens_total")
    time.sleep(1.0)
    assert metric(srv.url, "generation_tokens_total") == settled
    assert settled - before < 4 * 100
    assert metric(srv.url, "kv_cache_usage_perc") == 0.0
    assert metric(srv.url, "num_requests_running") == 0.0


# -- shutdown -----------------------------------------------------------------------------------
def test_sigterm_finishes_cleanly_within_the_grace_period(srv):
    """SIGTERM with a stream in flight: the process exits 0 after at most the grace period,
    the stream is ended, the run's summary.json is written and the core's IPC directory is
    gone. (It ends the shared server: the tests after it start their own.)"""
    assert list(srv.tmp.glob("lab-core-*"))  # the core's IPC sockets live here
    with httpx.stream("POST", srv.url + "/v1/completions", json=LONG | {"stream": True},
                      headers=AUTH, timeout=WAIT_S) as r:
        it = r.iter_lines()
        next(it)
        srv.proc.send_signal(signal.SIGTERM)
        try:
            for _ in it:
                pass
        except httpx.HTTPError:
            pass  # cut off when the grace period ended
    assert srv.wait(30) == 0
    assert (srv.run_dir / "summary.json").exists()
    assert not list(srv.tmp.glob("lab-core-*"))


def test_sigterm_while_the_engine_starts_cleans_up(short_tmp):
    """SIGTERM as soon as the core process is being started (its IPC directory exists): the
    server stops it, removes the directory and exits 1 naming the signal. The signal used to
    land inside multiprocessing's start, leaving a core the server could not stop: it built
    its engine unseen, then printed a BrokenPipeError traceback into the server's stderr
    (and once kept that pipe open past the test's 300 s)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "lab.cli", "serve", *ENGINE, "--port", str(free_port())],
        cwd=REPO, env={**os.environ, "TMPDIR": str(short_tmp)}, stderr=subprocess.PIPE,
        text=True)
    try:
        deadline = time.monotonic() + WAIT_S
        while not list(short_tmp.glob("lab-core-*")) and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert "stopped while the engine was starting (SIGTERM)" in err
    assert "Traceback" not in err, err[-3000:]
    assert not list(short_tmp.glob("lab-core-*"))


# -- the engine's death -------------------------------------------------------------------------
def _plain_in_background(url: str, body: dict) -> tuple[threading.Thread, dict]:
    got: dict = {}

    def post():
        got["r"] = httpx.post(url + "/v1/completions", json=body, timeout=WAIT_S)

    t = threading.Thread(target=post)
    t.start()
    return t, got


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_dead_or_hung_core_fails_requests_alike(fault, short_tmp):
    """kill -9 of the core, or SIGSTOP past core_timeout_s: a stream's in-band error and a plain
    request's answer are the same error object (503 ServiceUnavailableError). After a kill the
    server exits non-zero by itself (the default); after the stop, run with
    --keep-alive-on-engine-death, it stays up answering 503 until it is stopped. Either way its
    IPC directory goes and no core process is left (a stopped one is killed)."""
    keep_alive = fault == "stop"
    with server("core_timeout_s=3", *(["--keep-alive-on-engine-death"] if keep_alive else []),
                env={"TMPDIR": str(short_tmp)}) as s:
        core = s.core_pid()
        if fault == "stop":  # idle past core_timeout_s: the core's heartbeats keep it healthy
            time.sleep(3.5)
            assert httpx.get(s.url + "/health").status_code == 200
        t, got = _plain_in_background(s.url, LONG)
        with httpx.stream("POST", s.url + "/v1/completions", json=LONG | {"stream": True},
                          timeout=WAIT_S) as r:
            it = r.iter_lines()
            next(it)
            os.kill(core, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            events = [json.loads(line[6:]) for line in it if line.startswith("data: {")]
        t.join(30)
        if keep_alive:
            assert httpx.get(s.url + "/health").status_code == 503
            again = httpx.post(s.url + "/v1/completions", json=LONG)
            assert again.status_code == 503 and "not answered" in again.json()["error"]["message"]
            assert s.wait(1) is None  # still serving
            code = s.stop()
        else:
            code = s.wait(30)
    streamed = events[-1]["error"]
    plain = got["r"].json()["error"]
    assert got["r"].status_code == 503
    assert streamed["code"] == plain["code"] == 503
    assert streamed["type"] == plain["type"] == "ServiceUnavailableError"
    if fault == "stop":
        assert "not answered" in streamed["message"]
    assert code == 0 if keep_alive else code not in (None, 0)
    assert not list(short_tmp.glob("lab-core-*"))
    assert not Path(f"/proc/{core}").exists() or _zombie(core)


def _zombie(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
