"""The benchmark scripts run end to end (tiny shapes; they report, tests never assert timings)."""

import json
import sys
from pathlib import Path

import pytest

from lab import SamplingParams
from lab.bench import e2e, kernels, overhead, workload
from lab.layers.linear import Linear


def test_kernel_bench_smoke_checks_every_reference(capsys):
    kernels.main(["--smoke"])
    table = capsys.readouterr().out.strip().splitlines()
    rows = [line for line in table if line[:1].isdigit()]
    names = {line.split()[0] for line in rows}  # the §5 rows that have a tiny twin
    assert {"1", "4", "5", "6", "7", "8", "9", "10", "11", "14i", "17", "18", "19", "20",
            "21", "1w", "1ws", "7w", "7c"} == names  # and the attention features' rows
    assert len(rows) == 19 and all(line.rstrip().endswith("yes") for line in rows)


def test_overhead_bench_runs(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["overhead", "--requests", "40", "--max-num-seqs", "16"])
    overhead.main()
    assert "schedule+update per step" in capsys.readouterr().out


class FakeClock:
    """perf_counter for lab.bench.workload.timed_generate: each timed run takes the next of
    `durations` seconds."""

    def __init__(self, *durations: float) -> None:
        self.ticks = [t for d in durations for t in (0.0, d)]

    def perf_counter(self) -> float:
        return self.ticks.pop(0)


def test_e2e_bench_compares_configurations(capsys, monkeypatch):
    """Each --runs spec builds its own engine (the quant=int8 run's linears are int8, the first
    run's dense), and the table is the arithmetic of the tokens each timed generate returned and
    a fake clock (2 s, then 0.5 s): tok/s = tokens / seconds, ratio = tok/s / the first's."""
    engines, timed_tokens = [], []

    class SpyLLM(workload.LLM):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            engines.append(self.engine)

        def generate(self, prompts, params):
            outs = super().generate(prompts, params)
            if len(prompts) > 1:  # the timed call (the warm-up has one prompt)
                timed_tokens.append(sum(len(o.outputs[0].token_ids) for o in outs))
            return outs

    monkeypatch.setattr(workload, "LLM", SpyLLM)
    monkeypatch.setattr(workload, "time", FakeClock(2.0, 0.5))
    # a cache of 0.01 GiB: the bench's own 4 GiB would be touched at start (1 GiB of it)
    runs = ["attention=torch,cpu_kv_cache_gb=0.01",
            "attention=torch,quant=int8,cpu_kv_cache_gb=0.01"]
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
    assert rows[runs[0]] == ["2.00", f"{n_base / 2.0:.1f}", "1.00", "nan", "nan"]  # no floor: CPU
    assert rows[runs[1]] == ["0.50", f"{n_int8 / 0.5:.1f}", "4.00", "nan", "nan"]  # 1/4 the time


def test_e2e_run_specs_and_bandwidth_floor():
    """Run specs read values as run.py does (true is a bool, 8 an int); the floor is the weights
    once per step of the longest output plus each output token's context once from the cache."""
    assert e2e.parse_run("attention=triton_flash,compile=true,max_num_seqs=8") == {
        "attention": "triton_flash", "compile": True, "max_num_seqs": 8}
    params = [SamplingParams(max_tokens=3), SamplingParams(max_tokens=2)]
    # steps = 3; contexts: prompt 4 -> 4+5+6 = 15, prompt 1 -> 1+2 = 3
    assert e2e.floor_seconds([[0] * 4, [0]], params, weight_bytes=100, kv_bytes_per_token=10,
                             bandwidth=10.0) == (3 * 100 + 18 * 10) / 10.0


def test_ipc_bench_times_the_steps_an_inproc_core_returned():
    """lab.bench.ipc's per-step part: the captured step results and requests cross a ZMQ
    pair unchanged (checked inside) and get a positive time each."""
    from lab import LLM, SamplingParams
    from lab.bench.ipc import capture_requests, capture_steps, time_crossings
    from lab.core.protocol import EngineCoreOutputs, EngineCoreRequest

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


def test_throughput_rounds_quote_lab_against_the_peers_best_mode(capsys, monkeypatch):
    """Rounds: every mode runs once per round (lab's runs in their own process under the mode's
    OMP_WAIT_POLICY); the ratio quoted is lab's best mode under the peer's best mode's settings,
    per round, and its median."""
    from lab.bench import throughput

    speeds = {  # (engine, omp, mode) -> seconds per round
        ("lab", "unset", "eager"): [1.0, 1.0, 1.0], ("lab", "passive", "eager"): [2.0, 4.0, 1.0],
        ("vllm", "unset", "eager"): [2.0, 2.0, 2.5], ("vllm", "passive", "eager"): [4.0, 4.0, 4.0],
    }
    calls, envs = [], []

    def fake(mode, env_policy, ids):
        calls.append((mode.engine, mode.omp, mode.mode))
        return {"elapsed_s": speeds[calls[-1]][sum(c == calls[-1] for c in calls) - 1],
                "token_ids": ids}

    def fake_lab(mode, argv):
        assert "--one-run" not in argv and "--model" in argv
        return fake(mode, mode.omp, [[1, 2]])

    def fake_peer(python, path, prompts, args, compiled, env, repeat):
        envs.append(env.get("OMP_WAIT_POLICY"))
        assert repeat == 1 and not compiled
        return fake(throughput.Mode("vllm", "passive" if env.get("OMP_WAIT_POLICY") else "unset",
                                    "eager"), None, [[1, 3]])

    monkeypatch.setattr(throughput, "run_lab_process", fake_lab)
    monkeypatch.setattr(throughput, "run_peer", fake_peer)
    throughput.main(["--model", "tiny_llama", "--num-prompts", "2", "--output-len", "4",
                     "--repeat", "3", "--modes", "eager", "--no-hf", "--peer-python", "py"])
    out = capsys.readouterr().out
    assert len(calls) == 12 and calls[:4] == [("lab", "unset", "eager"), ("lab", "passive", "eager"),
                                              ("vllm", "unset", "eager"), ("vllm", "passive", "eager")]
    assert envs == [None, "PASSIVE"] * 3
    assert "peer's best mode: vllm   OMP_WAIT_POLICY=unset" in out
    assert "lab under the same settings, best mode: lab    OMP_WAIT_POLICY=unset" in out
    assert "lab / peer per round: 2.00, 2.00, 2.50  median 2.00" in out
    assert "0/1 sequences identical" in out  # the fake peer's ids differ from lab's


def fake_lab_runs(monkeypatch, result_of) -> list[list[str]]:
    """Stand in for run_lab_process's subprocess: each lab run's command line is recorded (the
    list returned) and its result file holds result_of(command line)."""
    from lab.bench import throughput

    cmds = []

    def fake_run(cmd, check, stdout, env):
        cmds.append(cmd)
        Path(cmd[cmd.index("--one-run") + 1]).write_text(json.dumps(result_of(cmd)))

    monkeypatch.setattr(throughput.subprocess, "run", fake_run)
    return cmds


def test_throughput_attention_ceiling_is_timed_beside_lab_but_never_quoted(capsys, monkeypatch):
    """--attention-ceiling: a lab-0a mode per lab mode, run with --attention-free; its ratio to
    the peer's best mode is printed under the quoted one, never chosen as lab's best mode (even
    when faster) and its token ids are not compared (they are wrong by design)."""
    from lab.bench import throughput

    seconds = {"lab": 2.0, throughput.CEILING: 1.0, "vllm": 2.5}
    cmds = fake_lab_runs(monkeypatch, lambda cmd: {"elapsed_s": seconds[
        throughput.CEILING if "--attention-free" in cmd else "lab"], "token_ids": [[1, 2]]})

    def fake_peer(python, path, prompts, args, compiled, env, repeat):
        return {"elapsed_s": seconds["vllm"], "token_ids": [[1, 2]]}

    monkeypatch.setattr(throughput, "run_peer", fake_peer)
    throughput.main(["--model", "tiny_llama", "--num-prompts", "2", "--output-len", "4",
                     "--repeat", "2", "--modes", "compiled", "--omp-wait-policy", "unset",
                     "--no-hf", "--peer-python", "py", "--attention-ceiling"])
    out = capsys.readouterr().out
    assert [("--attention-free" in c, "--compile" in c) for c in cmds] == [(False, True),
                                                                          (True, True)] * 2
    assert "lab under the same settings, best mode: lab    OMP_WAIT_POLICY=unset" in out
    assert "lab / peer per round: 1.25, 1.25  median 1.25" in out
    assert ("lab-0a (lab's best mode, decode attention free) / peer per round: 2.50, 2.50  "
            "median 2.50") in out
    ceiling_row = next(line for line in out.splitlines() if line.startswith("lab-0a "))
    assert ceiling_row.endswith("  -")


def test_throughput_one_run_writes_lab_timing_and_ids(tmp_path):
    from lab.bench import throughput

    out = tmp_path / "r.json"
    throughput.main(["--model", "tiny_llama", "--num-prompts", "2", "--output-len", "3",
                     "--input-len", "5", "--one-run", str(out)])
    import json

    r = json.loads(out.read_text())
    assert r["elapsed_s"] > 0 and [len(t) for t in r["token_ids"]] == [3, 3]
    assert throughput.omp_env("unset").get("OMP_WAIT_POLICY") is None
    assert throughput.omp_env("passive")["OMP_WAIT_POLICY"] == "PASSIVE"


def test_overhead_bench_drives_vllms_scheduler_on_the_same_trace(vllm_python):
    """vLLM's Scheduler (no model) and lab's, on one trace, take the same number of steps with
    the same mean batch: the comparison times the same work."""
    import argparse

    args = argparse.Namespace(requests=60, arrivals_per_step=4, max_num_seqs=16,
                              max_num_batched_tokens=1024, max_model_len=1024, block_size=16,
                              num_blocks=4096, seed=0)
    lab, peer = overhead.run(args), overhead.run_peer(vllm_python, args)
    assert (peer["steps"], round(peer["mean_batch"], 6)) == (lab["steps"],
                                                              round(lab["mean_batch"], 6))


def test_overhead_bench_rounds_print_the_median_ratio(capsys, monkeypatch):
    times = iter([1.0, 4.0, 3.0, 4.0, 1.0, 4.0])  # lab, peer per round

    def fake(*_):
        return {"steps": 5, "mean_batch": 2.0, "mean_ms": next(times), "p50_ms": 1.0,
                "p99_ms": 1.0, "total_s": 1.0, "version": "0.32.0"}

    monkeypatch.setattr(overhead, "run", fake)
    monkeypatch.setattr(overhead, "run_peer", fake)
    monkeypatch.setattr(sys, "argv", ["overhead", "--peer-python", "py", "--repeat", "3"])
    overhead.main()
    assert "median lab / vllm over 3 rounds: 0.25 (0.25, 0.75, 0.25)" in capsys.readouterr().out


def test_step_profile_parts_add_up_to_the_step(capsys):
    """Every part is timed: none negative (a part timed around the wrong call, or twice, would
    make a difference negative), the attention backend and the sampler were reached."""
    from lab.bench import step_profile

    argv = ["--model", "tiny_llama", "--num-prompts", "2", "--input-len", "6", "--output-len", "3"]
    table, steps = step_profile.profile(step_profile.parse_args(argv))
    *rows, (name, linears) = table
    parts = dict(rows[:-1])
    assert steps == 3  # one prefill step, then two decode steps
    assert all(v >= 0 for v in parts.values()) and parts["attention"] > 0 < parts["sampling"]
    assert name == "linears" and 0 < linears < parts["model"]  # timed inside model.forward
    step_profile.main(argv)
    out = capsys.readouterr().out
    assert "engine other" in out and "GEMMs (linear layers" in out


def test_step_profile_timers_put_back_an_instance_attribute():
    """Closing the timers restores what the instance had of its own (compile=true replaces
    model.forward on the instance: deleting it left the eager forward, which fails outside a
    step context) and lets a class method show through again."""
    from lab.metrics.timers import Timers

    class Model:
        def forward(self):
            return "class"

    m = Model()
    m.forward = lambda: "own"
    other = Model()
    timers = Timers()
    timers.wrap(m, "forward", "forward")
    timers.wrap(other, "forward", "forward")
    assert m.forward() == "own" and other.forward() == "class" and timers.calls["forward"] == 2
    timers.close()
    assert m.forward() == "own" and "forward" in vars(m)
    assert other.forward() == "class" and "forward" not in vars(other)


def test_cpu_gemm_bench_measures_each_fp32_gemms_error_against_float64():
    """The fp32 accuracy table: one error per implementation, each measured (nonzero: every one
    rounds in fp32) and small."""
    import torch

    from lab.bench import cpu_gemm
    from lab.kernels import cpu_sgemm

    if not cpu_sgemm.available():
        pytest.skip("torch has no MKL here (or the op could not be built)")
    names = [*cpu_gemm.lab_columns(torch.float32), "onednn", "F.linear"]
    err = cpu_gemm.accuracy(48, 640, 16, names)
    assert list(err) == names and all(0 < e < 1e-5 for e in err.values())


def test_cpu_decode_bench_times_the_kernel_over_every_layer(capsys):
    """Tiny stream, both paths (checked against each other first), one line per batch."""
    from lab.bench import cpu_decode
    from lab.kernels import cpu_paged_decode

    try:
        cpu_paged_decode.load()
    except cpu_paged_decode.CPUKernelUnavailable as e:
        pytest.skip(str(e))
    cpu_decode.main(["--preset", "bench_llama", "--dtype", "float32", "--batches", "2x20",
                     "1x33", "--stream-mb", "0.1", "--repeats", "1", "--portable"])
    lines = capsys.readouterr().out.splitlines()
    assert "bench_llama (4 layers), float32" in lines[0]
    assert lines[1].startswith("  2 requests x    20 keys  vector") and "portable" in lines[1]
    assert lines[2].startswith("  1 requests x    33 keys")


def test_lab_bench_names_are_the_runnable_modules(capsys):
    """`lab bench NAME` runs any module of lab/bench with a __main__ block; helpers are none,
    and the peer comparisons' scripts are not in the package at all (benchmarks/)."""
    from lab.bench import names
    from lab.cli import main

    found = set(names())
    assert {"serve", "throughput", "ipc", "overhead", "kernels", "executor", "e2e",
            "step_profile", "cpu_gemm"} <= found
    assert not found & {"peer", "workload", "attention_ceiling", "sampling_oracle", "vllm_peer"}
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "vllm_peer"])
    assert exit_.value.code == 2
    assert "name one of cpu_decode, cpu_gemm" in capsys.readouterr().err


def test_throughput_default_mode_is_lab_as_a_user_meets_it(capsys, monkeypatch):
    """--modes default,compiled --defaults: lab's default mode runs with --default-mode (and no
    --compile), the peer runs no default mode and gets --defaults (its own KV cache and limits);
    the default mode's ratio to the peer's best mode is printed per round; a --default-mode run
    builds LLM(path, dtype=...) with nothing else set and reports its threads."""
    from lab.bench import throughput
    from lab.bench.workload import checkpoint

    cmds = fake_lab_runs(monkeypatch, lambda cmd: {
        "elapsed_s": 1.0 if "--default-mode" in cmd else 2.0, "token_ids": [[1, 2]], "threads": 2})
    peer_calls = []

    def fake_peer(python, path, prompts, args, compiled, env, repeat):
        peer_calls.append((compiled, args.defaults))
        return {"elapsed_s": 1.5, "token_ids": [[1, 2]]}

    monkeypatch.setattr(throughput, "run_peer", fake_peer)
    throughput.main(["--model", "tiny_llama", "--num-prompts", "1", "--output-len", "2",
                     "--repeat", "2", "--modes", "default,compiled", "--omp-wait-policy", "unset",
                     "--no-hf", "--peer-python", "py", "--defaults"])
    out = capsys.readouterr().out
    assert [("--default-mode" in c, "--compile" in c, "--defaults" in c) for c in cmds] == \
        [(True, False, True), (False, True, True)] * 2
    assert peer_calls == [(True, True)] * 2
    assert "lab's default mode / peer per round: 1.50, 1.50  median 1.50" in out
    assert "threads 2" in out

    args = throughput.parse_args(["--model", "tiny_llama", "--default-mode"])
    llm = throughput.lab_llm(checkpoint("tiny_llama"), args)
    cfg = llm.engine.cfg
    assert cfg.compile is None and cfg.cpu_kv_cache_gb is None and cfg.max_num_seqs == 256
    assert llm.engine.model_info.attention_backend == "cpu"
