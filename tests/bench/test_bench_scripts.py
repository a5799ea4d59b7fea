"""The benchmark scripts run end to end (tiny shapes; they report, tests never assert timings)."""

import sys

from lab.bench import e2e, kernels, overhead
from lab.layers.linear import Linear


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


class FakeClock:
    """perf_counter for lab.bench.e2e: each timed run takes the next of `durations` seconds."""

    def __init__(self, *durations: float) -> None:
        self.ticks = [t for d in durations for t in (0.0, d)]

    def perf_counter(self) -> float:
        return self.ticks.pop(0)


def test_e2e_bench_compares_configurations(capsys, monkeypatch):
    """Each --runs spec builds its own engine (the quant=int8 run's linears are int8, the first
    run's dense), and the table is the arithmetic of the tokens each timed generate returned and
    a fake clock (2 s, then 0.5 s): tok/s = tokens / seconds, ratio = tok/s / the first's."""
    engines, timed_tokens = [], []

    class SpyLLM(e2e.LLM):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            engines.append(self.engine)

        def generate(self, prompts, params):
            outs = super().generate(prompts, params)
            if len(prompts) > 1:  # the timed call (the warm-up has one prompt)
                timed_tokens.append(sum(len(o.outputs[0].token_ids) for o in outs))
            return outs

    monkeypatch.setattr(e2e, "LLM", SpyLLM)
    monkeypatch.setattr(e2e, "time", FakeClock(2.0, 0.5))
    runs = ["attention=torch", "attention=torch,quant=int8"]
    e2e.main(["--model", "tiny_llama", "--num-seqs", "2", "--min-len", "4", "--max-len", "8",
              "--max-num-batched-tokens", "64", "--runs", *runs])
    lines = capsys.readouterr().out.strip().splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines[-2:]}
    assert list(rows) == runs
    methods = [{type(m.quant_method).__name__ for m in e.executor.worker.model.modules()
                if isinstance(m, Linear)} for e in engines]
    assert methods == [{"UnquantizedLinearMethod"}, {"Int8LinearMethod"}]
    n_base, n_int8 = timed_tokens
    assert n_base == n_int8 > 0  # ignore_eos: every run generates the same token counts
    assert rows[runs[0]] == ["2.00", f"{n_base / 2.0:.1f}", "1.00"]
    assert rows[runs[1]] == ["0.50", f"{n_int8 / 0.5:.1f}", "4.00"]  # same tokens in 1/4 the time


def test_ipc_bench_times_the_steps_an_inproc_core_returned():
    """lab.bench.ipc's per-step part: the captured step results and requests cross a ZMQ
    pair unchanged (checked inside) and get a positive time each."""
    from lab import LLM, SamplingParams
    from lab.bench.ipc import capture_requests, capture_steps, time_crossings
    from lab.engine.protocol import EngineCoreOutputs, EngineCoreRequest

    llm = LLM("tiny_llama", dtype="float32", device="cpu")
    steps, requests = capture_steps(llm), capture_requests(llm)
    llm.generate([[5, 6, 7], [8, 9]], SamplingParams(temperature=0, max_tokens=3))
    assert len(requests) == 2 and len(steps) == 3
    for messages, kind in (([s for s, _ in steps], EngineCoreOutputs),
                           (requests, EngineCoreRequest)):
        crossings = time_crossings(messages, kind, reps=2)
        assert all(c.nbytes > 0 and c.total_us > 0 for c in crossings)


def test_executor_bench_runs(capsys):
    """lab.bench.executor: every executor setting at one batch, and the broadcast rows."""
    from lab.bench import executor

    executor.main(["--model", "tiny_llama", "--batches", "2", "--input-len", "4",
                   "--output-len", "6", "--reps", "5"])
    out = capsys.readouterr().out
    for name in executor.SETTINGS:
        assert f"{name} " in out
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("SchedulerOutput broadcast"))
    rows = [line.split() for line in lines[head + 2 : head + 4]]
    assert [row[:2] for row in rows] == [["2", "1"], ["2", "2"]]
    assert all(float(row[4]) <= float(row[5]) for row in rows)  # one-way within the round trip
    assert [line.split()[0] for line in lines[-3:]] == ["256", "16384", "1048576"]  # all-reduce
