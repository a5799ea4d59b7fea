"""A `lab serve` process to probe from outside, as a user's client would: started on a free local
port, ready once /health answers 200, its engine-core process found among its children.

    with ServerProcess(["model=tiny_llama", "attention=torch", "--api-key", "K"]) as srv:
        httpx.get(srv.url + "/health")
        os.kill(srv.core_pid(), signal.SIGSTOP)

Leaving the block stops the server (SIGTERM, then SIGKILL after `stop_timeout`) and its core.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (Linux: read from /proc)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            kids.append(int(stat.parent.name))
    return kids


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def metric(url: str, name: str) -> float:
    """The value of the server's `lab:NAME` sample on /metrics (its first one), read with
    prometheus_client's parser: e.g. metric(url, "generation_tokens_total")."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"lab:{name}":
                return sample.value
    raise KeyError(f"lab:{name} is not in {url}/metrics")


class ServerProcess:
    """`python -m lab.cli serve ARGS --port P` (see the module docstring)."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None,
                 cwd: str | Path | None = None, ready_timeout: float = 120.0,
                 stop_timeout: float = 30.0, log: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args, self.env, self.cwd = args, env, cwd
        self.ready_timeout, self.stop_timeout = ready_timeout, stop_timeout
        self.log = log
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> ServerProcess:
        out = open(self.log, "wb") if self.log else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lab.cli", "serve", *self.args, "--port", str(self.port),
             "--log-level", "warning"],
            env={**os.environ, **(self.env or {})}, cwd=self.cwd, stdout=out,
            stderr=subprocess.STDOUT)
        if self.log:
            out.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        """Poll /health every 0.1 s through one client: `httpx.get` builds a client, and with it
        an SSL context (~60 ms of CPU on the 2-core test machine), per call, which over a start
        of ~10 s cost the poller 3-4 CPU-seconds, as much as the core process's own start."""
        deadline = time.monotonic() + self.ready_timeout
        with httpx.Client(timeout=1) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"lab serve exited with {self.proc.returncode} while "
                                       "starting" + (f" (log: {self.log})" if self.log else ""))
                try:
                    if client.get(self.url + "/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
        raise TimeoutError(f"lab serve was not ready after {self.ready_timeout:.0f} s")

    def core_pid(self) -> int:
        """The engine core's pid: the child of the server's fork server (multiprocessing's,
        lab.distributed.launch; the server's other child is multiprocessing's resource tracker)."""
        servers = [pid for pid in children_of(self.proc.pid)
                   if "multiprocessing.forkserver" in _cmdline(pid)]
        cores = [pid for server in servers for pid in children_of(server)]
        if len(cores) != 1:
            raise RuntimeError(f"lab serve (pid {self.proc.pid}) has {len(cores)} engine-core "
                               f"processes, expected one")
        return cores[0]

    def wait(self, timeout: float) -> int | None:
        """The server's exit code once it exited within `timeout` s, else None."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after stop_timeout; the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        code = self.wait(self.stop_timeout)
        if code is None:
            self.proc.kill()
            code = self.proc.wait()
        return code
