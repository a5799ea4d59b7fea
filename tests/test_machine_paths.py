"""No absolute path of one machine anywhere in the repository: a venv, a checkout or a home
directory of some developer's machine means nothing on another (the peer's python is an option
or LAB_VLLM_PYTHON, lab/bench/peer.py). Every text file git tracks is read; a path under /tmp,
a URL's path or a relative path is fine."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# An absolute path under a folder that only exists on some machines: home directories, a
# workspace or farm mount, /opt and /mnt installs. It starts the path (not after a word
# character, a dot, a tilde or a hyphen: `https://host/home/x`, `docs/work/x`, `~/work/x` and
# `$VENV/opt/x` are not machine paths); the match runs to the path's end, for the report.
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|root|farm|opt|mnt|scratch|home/\w+|Users/\w+)"
                          r"/[\w.-][^\s\"'`)\]]*")


def tracked_text_files() -> list[Path]:
    """Every file git tracks here that reads as UTF-8 text (binaries are skipped)."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    files = []
    for name in out.stdout.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file():
            continue
        try:
            path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        files.append(path)
    return files


def machine_paths(text: str) -> list[tuple[int, str]]:
    """(line number, the path) of every machine path in `text`."""
    return [(i, m.group(0)) for i, line in enumerate(text.splitlines(), 1)
            for m in MACHINE_PATH.finditer(line)]


# The examples are written with {R} for the root slash, so that this file holds no machine path.
@pytest.mark.parametrize("text", [t.format(R="/") for t in [
    "python {R}work/vllm-venv/bin/python x", "see {R}root/.cache/x", "File \"{R}farm/a/x.py\"",
    "{R}home/alice/venv/bin/python", "{R}Users/bob/lab", "{R}opt/torch/.venv/lib",
    "({R}mnt/data/x)", "`{R}work/main/lab`", "file://{R}work/x"]])
def test_the_pattern_finds_machine_paths(text):
    assert machine_paths(text), text


@pytest.mark.parametrize("text", [
    "cd /tmp && python x", "/tmp/oracle", "https://github.com/vllm-project/vllm/home/x",
    "POST /v1/completions", "lab/work/x", "~/work/x", "$VENV/opt/x", "../sibling/x",
    "/workloads", "/home", "a/b/opt/c", "--peer-python PY"])
def test_the_pattern_leaves_other_paths_alone(text):
    assert not machine_paths(text), text


def test_no_machine_path_in_the_repository():
    offenders = [f"{path.relative_to(ROOT)}:{line}: {found}"
                 for path in tracked_text_files()
                 for line, found in machine_paths(path.read_text(encoding="utf-8"))]
    assert not offenders, ("absolute paths of one machine (write an option, an environment "
                           "variable such as $LAB_VLLM_PYTHON, or a relative path):\n"
                           + "\n".join(offenders))
