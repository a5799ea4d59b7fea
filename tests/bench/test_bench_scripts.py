"""The benchmark scripts run end to end (tiny shapes; they report, tests never assert timings)."""

import sys

from lab.bench import kernels, overhead


def test_kernel_bench_smoke_checks_every_reference(capsys):
    kernels.main(["--smoke"])
    table = capsys.readouterr().out.strip().splitlines()
    rows = [line for line in table if line[:2].strip().isdigit()]
    names = {line.split()[0] for line in rows}  # the §5 rows that have a tiny twin
    assert {"1", "5", "6", "7", "8", "9", "10", "11", "14i", "17", "18", "19", "20", "21"} == names
    assert len(rows) == 14 and all(line.rstrip().endswith("yes") for line in rows)


def test_overhead_bench_runs(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["overhead", "--requests", "40", "--max-num-seqs", "16"])
    overhead.main()
    assert "schedule+update per step" in capsys.readouterr().out
