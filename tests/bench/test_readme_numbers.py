"""The README's numbers table is generated (lab/bench/readme_numbers.py): the block between its
markers is the rendering of the newest committed results file, with the machine, the load and
the date it was measured at, never figures typed by hand."""

import json

from lab.bench.readme_numbers import BEGIN, END, README, RESULTS, render


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
               "under_load": {"busy_processes": 3, "quiet": [{"load_before": 0.2, "threads": "2"}],
                              "loaded": [{"load_before": 4.2, "threads": "1"}],
                              "quiet_engine_s": 3.0, "loaded_engine_s": 4.5, "ratio": 1.5,
                              "loaded_per_core_engine_s": 9.0, "ratio_per_core": 3.0}}
    block = render(results)
    assert block.startswith(BEGIN) and block.endswith(END)
    assert "2026-01-02 at commit abc123 on Some CPU, 2 cores" in block
    assert "| `python run.py` | 64 | 9.0 s | 0.31 | 2 | 12 | 0.50 / 0.51 / 1.20 s |" in block
    assert "3 busy processes" in block and "1.50x the quiet machine's 3.00 s" in block
    assert "4.2 at its start" in block and "9.00 s, 3.00x" in block
