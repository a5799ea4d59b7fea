"""The vLLM-CPU peer for comparison tests: its python (LAB_VLLM_PYTHON, else the default venv of
experiments/peer_setup.md), or the test skips."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from lab.bench.sampling_oracle import DEFAULT_PEER_PYTHON

PEER_PYTHON = os.environ.get("LAB_VLLM_PYTHON", DEFAULT_PEER_PYTHON)


def peer_available() -> bool:
    if not Path(PEER_PYTHON).exists():
        return False
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "2"}
    r = subprocess.run([PEER_PYTHON, "-c", "import vllm"], capture_output=True, env=env,
                       cwd="/tmp", timeout=300)
    return r.returncode == 0


@pytest.fixture(scope="session")
def vllm_python() -> str:
    if not peer_available():
        pytest.skip(f"no vLLM peer at {PEER_PYTHON} (set LAB_VLLM_PYTHON)")
    return PEER_PYTHON
