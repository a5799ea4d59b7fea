"""The README's numbers table is generated (lab/bench/readme_numbers.py): the block between its
markers is the rendering of the newest committed results file, with the machine, the load and
the date it was measured at, never figures typed by hand."""

import json
import os
import time
from pathlib import Path

import pytest

from lab.bench.readme_numbers import BEGIN, END, README, RESULTS, busy_processes, load_lines, render


def newest_results() -> dict:
    files = sorted(RESULTS.glob("*-readme-numbers.json"))
    assert files, "no experiments/results/*-readme-numbers.json: run python -m lab.bench.readme_numbers"
    return json.loads(files[-1].read_text())


def test_the_readme_table_is_the_newest_measurement():
    assert render(newest_results()) in README.read_text(), (
        "regenerate it: python -m lab.bench.readme_numbers --render FILE, or measure again with "
        "--write-readme")


def test_the_block_names_machine_load_date_and_commit():
    results = {"date": "2026-01-02", "commit": "abc123", "machine": "Some CPU, 2 cores",
               "commands": [{"command": "python run.py", "requests": 64, "wall_s": 9.04,
                             "load_before": 0.31, "threads": "2", "preemptions": 12,
                             "ttft_p50_by_priority_s": {"0": 0.5, "1": 0.51, "2": 1.2}}],
               "under_load": {
                   "busy_processes": 3, "quiet": [{"load_before": 0.2, "threads": "2"}],
                   "quiet_engine_s": 3.0,
                   "same_session": {"loaded": [{"load_before": 4.2, "threads": "1"}],
                                    "loaded_engine_s": 7.5, "ratio": 2.5,
                                    "loaded_per_core_engine_s": 9.0, "ratio_per_core": 3.0},
                   "other_session": {"loaded": [{"load_before": 3.9, "threads": "1"}],
                                     "loaded_engine_s": 4.5, "ratio": 1.5,
                                     "loaded_per_core_engine_s": 12.0, "ratio_per_core": 4.0}}}
    block = render(results)
    assert block.startswith(BEGIN) and block.endswith(END)
    assert "2026-01-02 at commit abc123 on Some CPU, 2 cores" in block
    assert "| `python run.py` | 64 | 9.0 s | 0.31 | 2 | 12 | 0.50 / 0.51 / 1.20 s |" in block
    assert "3 busy processes" in block and "the quiet machine's 3.00 s" in block
    own, other = (line for line in block.splitlines() if line.startswith("- load"))
    assert "own session" in own and "4.2 at the run's start" in own and "**2.50x**" in own
    assert "9.00 s, 3.00x" in own
    assert "another session" in other and "3.9 at" in other and "**1.50x**" in other
    assert "12.00 s, 4.00x" in other


def test_an_earlier_file_renders_its_one_loaded_measurement():
    """Results files from before the other-session runs kept the own-session ones at top
    level: the README can still show any committed file."""
    earlier = {"busy_processes": 3, "quiet": [{"load_before": 0.47, "threads": "2"}],
               "loaded": [{"load_before": 2.3, "threads": "1"}], "quiet_engine_s": 0.33,
               "loaded_engine_s": 0.86, "ratio": 2.61, "loaded_per_core_engine_s": 4.43,
               "ratio_per_core": 13.42}
    lines = load_lines(earlier)
    assert len([line for line in lines if line.startswith("- load")]) == 1
    assert "own session" in lines[-1] and "**2.61x**" in lines[-1]


def _group(pgid: int) -> list[tuple[int, int]]:
    """(pid, session id) of every live process in process group `pgid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited while listed
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append((int(stat.parent.name), int(fields[3])))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("other_session", [False, True])
def test_the_busy_processes_share_one_session_and_go_away(other_session):
    """The loaded-machine runs' load: all its processes in one group, in this session or in one
    other session (the case autogroup scheduling treats as another user's work), and none left
    running afterwards."""
    with busy_processes(2, other_session) as pgid:
        deadline = time.monotonic() + 30
        while len(members := _group(pgid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(members) == 2
        sessions = {sid for _, sid in members}
        assert len(sessions) == 1
        assert (sessions.pop() != os.getsid(0)) == other_session
    deadline = time.monotonic() + 30  # SIGKILLed: each ends once the kernel runs it
    while _group(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _group(pgid) == []
