"""The benchmark scripts run end to end (tiny shapes; they report, tests never assert timings)."""

import sys

from lab.bench import e2e, kernels, overhead


def test_kernel_bench_smoke_checks_every_reference(capsys):
    kernels.main(["--smoke"])
    table = capsys.readouterr().out.strip().splitlines()
    rows = [line for line in table if line[:2].strip().isdigit()]
    names = {line.split()[0] for line in rows}  # the §5 rows that have a tiny twin
    assert {"1", "4", "5", "6", "7", "8", "9", "10", "11", "14i", "17", "18", "19", "20",
            "21"} == names
    assert len(rows) == 15 and all(line.rstrip().endswith("yes") for line in rows)


def test_overhead_bench_runs(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["overhead", "--requests", "40", "--max-num-seqs", "16"])
    overhead.main()
    assert "schedule+update per step" in capsys.readouterr().out


def test_e2e_bench_compares_configurations(capsys):
    e2e.main(["--model", "tiny_llama", "--num-seqs", "2", "--min-len", "4", "--max-len", "8",
              "--max-num-batched-tokens", "64", "--runs", "attention=torch",
              "attention=torch,quant=int8"])
    lines = capsys.readouterr().out.strip().splitlines()
    rows = {line.split()[0]: line.split() for line in lines[-2:]}
    assert set(rows) == {"attention=torch", "attention=torch,quant=int8"}
    assert rows["attention=torch"][-1] == "1.00"
