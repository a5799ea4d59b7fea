"""tests/procs.py run_python: `python ARGS` as a fork of lab's fork server behaves as the
interpreter would for what the tests read (exit code, stdout, stderr, argv, cwd, environment,
exit handlers, an uncaught exception, a timeout)."""

import subprocess

import pytest

from tests.procs import run_python

SCRIPT = """
import atexit, os, sys
atexit.register(lambda: print("at exit"))
print("out", sys.argv, os.getcwd(), os.environ.get("LAB_PROCS_PROBE"), sys.path[0])
print("err", file=sys.stderr)
if sys.argv[1] == "raise":
    raise RuntimeError("boom")
if sys.argv[1] == "hang":
    import time; time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


def test_a_script_s_exit_code_streams_argv_cwd_and_environment(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    proc = run_python([str(script), "3"], cwd=tmp_path, env={"LAB_PROCS_PROBE": "x"})
    assert proc.returncode == 3
    assert proc.stdout.splitlines() == [f"out [{str(script)!r}, '3'] {tmp_path} x {tmp_path}",
                                        "at exit"]
    assert proc.stderr == "err\n"
    failed = run_python([str(script), "raise"], cwd=tmp_path)
    assert failed.returncode == 1
    assert failed.stderr.startswith("err\nTraceback") and "RuntimeError: boom" in failed.stderr
    with pytest.raises(subprocess.TimeoutExpired):
        run_python([str(script), "hang"], cwd=tmp_path, timeout=1)


def test_a_module_runs_as_main_with_its_arguments(tmp_path):
    knobs = run_python(["-m", "lab.cli", "knobs"], cwd=tmp_path)
    assert knobs.returncode == 0 and "max_num_seqs = 256" in knobs.stdout
    nope = run_python(["-m", "lab.cli", "nope"], cwd=tmp_path)
    assert nope.returncode == 2 and nope.stderr.startswith("usage: lab {serve,run,bench,knobs}")
