"""Compile Triton kernels for sm_90 (Hopper) on a machine without a GPU.

A kernel test writes the body of a script that calls `build(fn, types, consts, aligned, **opts)`
for its kernels and prints "ok"; `compile_for_sm90(body)` runs PRELUDE + body with
TRITON_INTERPRET=0 (compiled mode), skips when the triton wheel lacks the NVIDIA backend or
ptxas, and returns what the body printed (`.stdout`).

LAB_SM90_PYTHON=/path/to/python runs the worker with another interpreter, e.g. a venv holding the
Triton version of the GPU machine (with this environment's torch: `python -m venv
--system-site-packages V && V/bin/pip install triton==X`); triton 3.9 accepted kernels that 3.6,
on the first H200 run, refused.

The bodies run one after another in one worker process per test session (started on first use),
each in a fresh namespace with its environment variables set only while it runs (triton reads its
knobs from the environment when it compiles): starting Python, torch and triton once instead of
once per kernel file saves several CPU-seconds per test. A body that kills the worker fails its
test, and the next body gets a new worker.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.waits import WAIT_S

PRELUDE = textwrap.dedent("""
    import triton
    from triton.backends.compiler import GPUTarget

    def build(fn, types, consts, aligned=(), **opts):
        sig = {n: types.get(n, "constexpr" if n in consts else "i32") for n in fn.arg_names}
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if n in aligned}
        src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
""")

# Reads one JSON request per line ({"script", "env"}), answers one JSON line ({"ok", "stdout",
# "error"}); the body's prints are captured, the protocol uses the real stdout.
_WORKER = textwrap.dedent("""
    import contextlib, io, json, os, sys, traceback
    out = sys.stdout
    for line in sys.stdin:
        req = json.loads(line)
        saved = {k: os.environ.get(k) for k in req["env"]}
        os.environ.update(req["env"])
        buf, ok, err = io.StringIO(), True, ""
        try:
            with contextlib.redirect_stdout(buf):
                exec(compile(req["script"], "<sm90 body>", "exec"), {"__name__": "__sm90__"})
        except BaseException:
            ok, err = False, traceback.format_exc()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        out.write(json.dumps({"ok": ok, "stdout": buf.getvalue(), "error": err}) + "\\n")
        out.flush()
""")

_worker: subprocess.Popen | None = None


def _get_worker() -> subprocess.Popen:
    global _worker
    if _worker is None or _worker.poll() is not None:
        env = {**os.environ, "TRITON_INTERPRET": "0"}
        log = tempfile.TemporaryFile("w+")  # stderr: read back only when the worker dies
        python = os.environ.get("LAB_SM90_PYTHON") or sys.executable
        _worker = subprocess.Popen([python, "-c", _WORKER], env=env, text=True,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                   cwd=Path(__file__).resolve().parents[2])
        _worker.log = log
        atexit.register(_stop, _worker)
    return _worker


def _stop(worker: subprocess.Popen) -> None:
    if worker.poll() is None:
        worker.stdin.close()
        worker.wait(timeout=WAIT_S)


def compile_for_sm90(body: str, **env_vars: str) -> SimpleNamespace:
    """Run PRELUDE + body for sm_90 (with extra environment variables while it runs); assert it
    finished cleanly and printed "ok"; return its output (`.stdout`)."""
    pytest.importorskip("triton.backends.nvidia")
    worker = _get_worker()
    request = {"script": PRELUDE + textwrap.dedent(body), "env": env_vars}
    worker.stdin.write(json.dumps(request) + "\n")
    worker.stdin.flush()
    line = worker.stdout.readline()
    if not line:  # the worker died (its stderr says why); the next call starts another
        worker.wait(timeout=WAIT_S)
        worker.log.seek(0)
        raise AssertionError(f"sm_90 compile worker died:\n{worker.log.read()[-3000:]}")
    answer = json.loads(line)
    if re.search(r"(ptxas|cuobjdump).*(not found|No such file)", answer["error"]):
        pytest.skip("no ptxas/cuobjdump in this triton install")
    assert answer["ok"] and "ok" in answer["stdout"], answer["error"][-3000:]
    return SimpleNamespace(stdout=answer["stdout"])
