"""Tests that need a process of their own: a Python script run by a fresh interpreter that
imports this checkout's `lab` (start_script), or a command line such as `python run.py ...`
run as a fork of lab's fork server (run_python); a short directory for such a process's TMPDIR
(short_tmp_dir)."""

from __future__ import annotations

import atexit
import os
import runpy
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lab.distributed.launch import mp_context

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def short_tmp_dir() -> Iterator[Path]:
    """A directory for a child process's TMPDIR, where its fork server and lab's IPC sockets
    live: a socket's path holds 107 bytes, and pytest's tmp_path (its user name, run number and
    test name) can take most of them (lab.distributed.launch.socket_tempdir refuses a TMPDIR
    too long; the fork server failed on one at pytest's 100th run on a machine)."""
    with tempfile.TemporaryDirectory(prefix="lab-test-", ignore_cleanup_errors=True) as tmp:
        yield Path(tmp)


def start_script(path: Path, text: str, tmpdir: Path | None = None) -> subprocess.Popen:
    """Write `text` to `path` and run it; its stdout is a text pipe (the caller kills it).
    `tmpdir`: its TMPDIR (where tempfile makes directories)."""
    path.write_text(text)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if tmpdir is not None:
        tmpdir.mkdir(exist_ok=True)
        env["TMPDIR"] = str(tmpdir)
    return subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, text=True,
                            env=env)


def run_python(args: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """`python ARGS` (a script and its arguments, or `-m MODULE ...`), run to its end like
    `subprocess.run(..., capture_output=True, text=True)`: its exit code, stdout and stderr.

    The process is a fork of lab's fork server (lab.distributed.launch.mp_context), which
    imported torch, transformers and lab's engine once per test process: the command's own
    work without a fresh interpreter's ~4 CPU-s of imports. What a fresh interpreter shows
    (the imports themselves, as in test_layering.py) needs start_script or subprocess.
    `env`: the whole environment (the caller's by default)."""
    with tempfile.TemporaryDirectory(prefix="lab-run-python-") as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        proc = mp_context("forkserver").Process(
            target=_python_main, name="run_python",
            args=(list(args), str(cwd), dict(os.environ if env is None else env), str(out),
                  str(err)))
        proc.start()
        proc.join(timeout)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            raise subprocess.TimeoutExpired([sys.executable, *args], timeout, _read(out),
                                            _read(err))
        return subprocess.CompletedProcess([sys.executable, *args], proc.exitcode, _read(out),
                                           _read(err))


def _read(path: Path) -> str:
    return path.read_bytes().decode(errors="replace") if path.exists() else ""


def _python_main(args: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """In the fork: what the interpreter does for `python ARGS` in `cwd` with `env`, its
    stdout and stderr into the files `out` and `err`; the exit code is its SystemExit's."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    try:
        if args[0] == "-m":  # as `python -m`: the working directory first on the path
            sys.argv = [args[1], *args[2:]]
            sys.path.insert(0, cwd)
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:  # as `python SCRIPT`: the script's directory first on the path
            script = os.path.abspath(args[0])
            sys.argv = [args[0], *args[1:]]
            sys.path.insert(0, os.path.dirname(script))
            runpy.run_path(script, run_name="__main__")
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - reported as the interpreter would, exit code 1
        traceback.print_exc()
        raise SystemExit(1) from None
    finally:
        atexit._run_exitfuncs()  # an interpreter's exit runs them; a forked process's does not
        sys.stdout.flush()
        sys.stderr.flush()
