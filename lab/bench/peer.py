"""The vLLM peer of lab's comparison benches: whose python runs it, and which script.

    lab bench throughput --peer-python /path/to/vllm-venv/bin/python
    export LAB_VLLM_PYTHON=/path/to/vllm-venv/bin/python
    lab bench throughput --peer-python            # bare: the python $LAB_VLLM_PYTHON names

The peer is a separate venv with vLLM installed (experiments/peer_setup.md); lab never imports
it. Its python is given on the command line or in the environment variable LAB_VLLM_PYTHON,
never written in the source. What runs under it are the standalone scripts of the repository's
`benchmarks/` folder (`vllm_peer.py`, `vllm_sched_peer.py`, `vllm_mq_peer.py`), which are not
installed with lab: a peer comparison runs from a checkout of the repository.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

#: the environment variable that names the peer's python
PYTHON_ENV = "LAB_VLLM_PYTHON"
#: the folder of the peer scripts: benchmarks/ beside the lab package in a checkout
SCRIPTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


class PeerUnavailable(RuntimeError):
    """No peer can run: its python is not given, or its script is not here."""


def env_python() -> str | None:
    """The python LAB_VLLM_PYTHON names, or None when it is unset or empty."""
    return os.environ.get(PYTHON_ENV) or None


def require_python(value: str | None) -> str:
    """`value`, else LAB_VLLM_PYTHON's python; PeerUnavailable when neither is given."""
    python = value or env_python()
    if python is None:
        raise PeerUnavailable(f"no vLLM peer: give --peer-python PY or set {PYTHON_ENV} to the "
                              "python of a venv with vLLM (experiments/peer_setup.md)")
    return python


def peer_script(name: str) -> Path:
    """The peer script `name` in the repository's benchmarks/ folder; PeerUnavailable, saying
    why, when this lab is an installed copy without that folder."""
    path = SCRIPTS_DIR / name
    if not path.is_file():
        raise PeerUnavailable(
            f"the vLLM peer script {name} is not at {path}: the peer scripts live in the "
            "repository's benchmarks/ folder, which is not installed with lab; run the "
            "comparison from a checkout of the repository (pip install -e .)")
    return path


def add_peer_argument(parser: argparse.ArgumentParser, script_name: str, purpose: str) -> None:
    """--peer-python [PY]: the peer's python (bare: LAB_VLLM_PYTHON's), checked at parse time
    together with the script it will run (`script_name`, in benchmarks/)."""
    parser.add_argument(
        "--peer-python", nargs="?", const=None, default=None, metavar="PY",
        action=_PeerPython, script_name=script_name,
        help=f"python of a venv with vLLM: {purpose} (bare: ${PYTHON_ENV}; runs "
             f"benchmarks/{script_name} of the repository under it)")


class _PeerPython(argparse.Action):
    """Resolves a bare --peer-python to LAB_VLLM_PYTHON and checks the peer script is here."""

    def __init__(self, *args, script_name: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.script_name = script_name

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        try:
            python = require_python(value)
            peer_script(self.script_name)
        except PeerUnavailable as e:
            parser.error(str(e))
        setattr(namespace, self.dest, python)
