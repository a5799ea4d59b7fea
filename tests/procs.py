"""Tests that need a process of their own: a Python script run by a fresh interpreter that
imports this checkout's `lab`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
