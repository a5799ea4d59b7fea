"""Where and how lab's C++ CPU kernels are built (lab/kernels/cpu_ext.py): one build directory
per install (or $TORCH_EXTENSIONS_DIR), never torch's shared default; one builder at a time
under a lock that a killed builder does not keep, with the lock file torch's own build left
behind removed; a live builder waited for up to a timeout, then a clear error. No real
compiles: the compile step is replaced by a recorder."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import ModuleType

import pytest

from lab.kernels import build as build_cli
from lab.kernels import cpu_ext
from lab.kernels.cpu_ext import CPUExtension, CPUKernelUnavailable, build_lock


@pytest.fixture
def fresh_root(tmp_path, monkeypatch) -> Path:
    """An empty TORCH_EXTENSIONS_DIR."""
    root = tmp_path / "ext"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    return root


@pytest.fixture
def compiles(monkeypatch) -> list[tuple[str, Path, bool]]:
    """Each compile as (name, build dir, whether torch's lock file was there), returning a
    stand-in module instead of building."""
    calls: list[tuple[str, Path, bool]] = []

    def record(name, source, cflags, build_dir):
        calls.append((name, build_dir, (build_dir / cpu_ext.TORCH_BATON).exists()))
        return ModuleType(name)

    monkeypatch.setattr(cpu_ext, "compile_extension", record)
    return calls


def test_the_build_directory_is_this_installs_unless_the_user_names_one(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path))
    root = cpu_ext.extensions_root()
    assert root == tmp_path / "torch_extensions" / cpu_ext.install_key()
    assert cpu_ext.install_key(tmp_path / "another" / "lab") != cpu_ext.install_key()
    from torch.utils.cpp_extension import _get_build_directory

    assert not str(root).startswith(str(Path(_get_build_directory("x", False)).parent))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "mine"))
    assert cpu_ext.extensions_root() == tmp_path / "mine"


def test_a_build_goes_to_the_root_under_the_lock_and_is_loaded_once(fresh_root, compiles):
    ext = CPUExtension("cpu_argmax")
    module = ext.load()
    assert ext.load() is module and ext.loaded() is module and len(compiles) == 1
    name, build_dir, _ = compiles[0]
    assert build_dir == fresh_root / ext.name() and name == ext.name()
    assert "pid" in (fresh_root / f"{name}.lock").read_text()


def test_loaded_never_builds(compiles):
    with pytest.raises(RuntimeError, match="cpu_argmax.cpp is not loaded in this process"):
        CPUExtension("cpu_argmax").loaded()
    assert not compiles


def test_a_stale_lock_left_by_a_killed_builder_is_recovered(fresh_root, compiles):
    """A builder killed mid-build: its lock file (with its dead pid) and torch's lock file in the
    build directory (on which torch's own build waits forever) are left behind. The next build
    proceeds at once, without torch's lock file."""
    ext = CPUExtension("cpu_argmax")
    build_dir = fresh_root / ext.name()
    build_dir.mkdir(parents=True)
    (build_dir / cpu_ext.TORCH_BATON).touch()
    (fresh_root / f"{ext.name()}.lock").write_text("pid 999999999 since 2020-01-01 00:00:00")
    start = time.monotonic()
    ext.build()
    assert time.monotonic() - start < 5
    assert compiles == [(ext.name(), build_dir, False)]


KILLED_BUILDER = textwrap.dedent("""
    import fcntl, os, sys, time
    lock, baton = sys.argv[1], sys.argv[2]
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, f"pid {os.getpid()}".encode())
    open(baton, "w").close()
    print("building", flush=True)
    time.sleep(60)
""")


def test_a_builder_killed_mid_build_leaves_nothing_that_blocks_the_next(fresh_root, compiles):
    """The same with a real process: it takes the lock, starts torch's build (its lock file),
    is killed; the next build does not wait."""
    ext = CPUExtension("cpu_argmax")
    build_dir = fresh_root / ext.name()
    build_dir.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", KILLED_BUILDER, str(fresh_root / f"{ext.name()}.lock"),
                             str(build_dir / cpu_ext.TORCH_BATON)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "building"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    ext.build()
    assert compiles == [(ext.name(), build_dir, False)]


def test_a_live_builder_is_waited_for_then_named(fresh_root, compiles, monkeypatch):
    ext = CPUExtension("cpu_argmax")
    lock = fresh_root / f"{ext.name()}.lock"
    lock.parent.mkdir(parents=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another open file: another holder, as another process
    os.write(fd, b"pid 4242 since 2026-01-01 00:00:00")
    monkeypatch.setattr(cpu_ext, "LOCK_TIMEOUT_S", 0.3)
    try:
        with pytest.raises(CPUKernelUnavailable, match=r"\(pid 4242 since .*\) still holds the "
                                                       r"build lock .* after 0 s"):
            ext.build()
        assert not compiles
    finally:
        os.close(fd)
    ext.build()  # released: the next build goes ahead
    assert len(compiles) == 1


def test_the_lock_is_released_when_the_body_raises(tmp_path):
    lock = tmp_path / "x.lock"
    with pytest.raises(ValueError), build_lock(lock, timeout_s=0.1):
        raise ValueError
    with build_lock(lock, timeout_s=0.1):
        pass


def test_a_failed_compile_is_reported_as_unavailable(fresh_root, monkeypatch):
    def no_compiler(*args):
        raise OSError("no C++ compiler")

    monkeypatch.setattr(cpu_ext, "compile_extension", no_compiler)
    with pytest.raises(CPUKernelUnavailable, match="cpu_argmax.cpp could not be built: no C"):
        CPUExtension("cpu_argmax").build()


def test_the_install_time_build_reports_each_kernel(fresh_root, compiles, monkeypatch):
    """`python -m lab.kernels.build` (scripts/install.sh): every kernel that applies, built in
    the install's directory; exit 1 when one could not be built."""
    for module in build_cli.KERNELS:
        monkeypatch.setattr(module.EXTENSION, "module", None)
    lines: list[str] = []
    assert build_cli.build_all(lines.append) == []
    built = {build_dir.parent for _, build_dir, _ in compiles}
    assert built == {fresh_root} and len(compiles) == sum(m.applies() for m in build_cli.KERNELS)
    assert len(lines) == len(build_cli.KERNELS)

    def broken(*args):
        raise OSError("no ninja")

    monkeypatch.setattr(cpu_ext, "compile_extension", broken)
    for module in build_cli.KERNELS:
        monkeypatch.setattr(module.EXTENSION, "module", None)
    assert build_cli.main([]) == 1
