"""lab.bench.peer: the peer's python comes from --peer-python or LAB_VLLM_PYTHON (never a path in
the source), and its scripts from the repository's benchmarks/ folder, with a clear error where
either is missing."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab.bench import peer

ROOT = Path(__file__).resolve().parents[2]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench")
    peer.add_peer_argument(p, "vllm_peer.py", "the same batch on vLLM")
    return p


def test_peer_python_is_the_option_else_the_environment(monkeypatch):
    monkeypatch.setenv(peer.PYTHON_ENV, "env-python")
    assert parser().parse_args([]).peer_python is None  # no option: no peer, whatever the env
    assert parser().parse_args(["--peer-python"]).peer_python == "env-python"
    assert parser().parse_args(["--peer-python", "py"]).peer_python == "py"


def test_a_bare_peer_python_without_the_environment_is_refused(monkeypatch, capsys):
    monkeypatch.delenv(peer.PYTHON_ENV, raising=False)
    with pytest.raises(SystemExit):
        parser().parse_args(["--peer-python"])
    assert peer.PYTHON_ENV in capsys.readouterr().err


def test_without_the_repositorys_benchmarks_the_peer_is_refused(monkeypatch, tmp_path, capsys):
    """An installed lab has no benchmarks/ beside it: the error says where the scripts live."""
    monkeypatch.setattr(peer, "SCRIPTS_DIR", tmp_path / "benchmarks")
    with pytest.raises(SystemExit):
        parser().parse_args(["--peer-python", "py"])
    err = capsys.readouterr().err
    assert "vllm_peer.py" in err and "benchmarks/ folder" in err
    with pytest.raises(peer.PeerUnavailable, match="checkout of the repository"):
        peer.peer_script("vllm_sched_peer.py")


def test_every_peer_script_the_benches_name_is_in_benchmarks():
    for name in ("vllm_peer.py", "vllm_sched_peer.py", "vllm_mq_peer.py"):
        assert peer.peer_script(name) == ROOT / "benchmarks" / name


def test_the_sampling_oracle_needs_a_peer_python(monkeypatch, capsys):
    """No default python of some machine: without --peer-python or LAB_VLLM_PYTHON the oracle
    stops at once, naming both."""
    from benchmarks import sampling_oracle

    monkeypatch.delenv(peer.PYTHON_ENV, raising=False)
    with pytest.raises(SystemExit):
        sampling_oracle.main([])
    err = capsys.readouterr().err
    assert "--peer-python" in err and peer.PYTHON_ENV in err


@pytest.mark.parametrize("module", ["benchmarks.sampling_oracle"])
def test_benchmarks_run_as_modules_from_the_repository_root(module):
    done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--peer-python" in done.stdout


@pytest.mark.parametrize("script", ["vllm_peer.py", "vllm_sched_peer.py", "vllm_mq_peer.py",
                                    "vllm_op_profile.py"])
def test_peer_scripts_import_no_lab(script, tmp_path):
    """The peer scripts run under the peer's python, which has no lab: --help works from outside
    the repository with lab hidden."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-S", str(ROOT / "benchmarks" / script), "--help"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
