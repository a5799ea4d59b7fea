"""Speculative decoding with prompt lookup (`speculative=ngram`): output tokens/s and latency vs
the drafts per step k in {0 (off), 1, 3, 5}, real on this CPU and simulated on an H100. One
command:

    python experiments/speculative/run.py             # ~1.5 min on 2 idle cores: both parts
    python experiments/speculative/run.py --smoke     # ~15 s: fewer requests and points

Two parts:
  real       tiny_llama (random weights) on this CPU, attention=cpu, fp32, 16 requests at t=0,
             greedy, on three workloads:
               repetitive  each prompt one random 16-token phrase repeated 8 times (prompt
                           lookup finds the phrase; whether the model's output follows it is
                           what acceptance measures)
               random      random prompts of the same length
               probe       prompts holding every token id of the vocabulary, with
                           prompt_lookup_min=1: every request finds a match and verifies k
                           drafts every step, whatever the model emits — the cost of verifying
                           k drafts, at the acceptance a random model gives them
  simulated  a config-only Llama-3-8B on a simulated H100 (executor=sim, sim/step_time=roofline:
             data-sheet peaks x guessed efficiencies, uncalibrated), 8 and 64 requests of 512
             prompt + 256 output tokens at t=0, draft acceptance alpha in {0, 0.5, 0.7, 0.9} per
             position (sim.spec.acceptance_rate), and once with the acceptance measured on the
             CPU's repetitive run (sim.spec.acceptance_from).

Per point: output tokens/s (speedup over k=0), TPOT and E2E p50, steps, the median time of a
step without prompt tokens (a decode or verify step), real: what the ngram lookup alone takes
for such a step (timed apart), drafts verified and accepted (rate, mean accepted per
verification, per position). Real points run --repeats times, interleaved; the fastest repeat
is reported (other processes only slow a run down). For the probe, the acceptance per position
at which k drafts would pay on this CPU: a step verifying k drafts costs r decode steps, and
pays when 1 + alpha + ... + alpha^k > r (Leviathan et al.'s geometric model).
Writes results/summary.csv, results/table.md, results/speculative.png (--smoke: under
outputs/speculative-smoke/, the committed results untouched).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))  # the repository root: run as a script from anywhere

from lab.config.compose import compose_config  # noqa: E402
from lab.engine.llm_engine import LLMEngine  # noqa: E402
from lab.engine.replay import replay  # noqa: E402
from lab.metrics.jsonl import JsonlLogger  # noqa: E402
from lab.metrics.memory import InMemoryLogger  # noqa: E402
from lab.sim.configs import write_configs  # noqa: E402
from lab.workloads.base import Workload, WorkloadRequest  # noqa: E402
from lab.workloads.synthetic import SyntheticWorkload  # noqa: E402

FIELDS = ("part", "workload", "proposer", "requests", "k", "alpha", "output_tok_s", "speedup", "tpot_p50_ms",
          "e2e_p50_s", "steps", "decode_step_ms", "lookup_ms", "verifications", "drafts", "accepted",
          "acceptance", "mean_accepted", "per_position", "repeats_tok_s", "wall_s")
KS = (0, 1, 3, 5)
ALPHAS = (0.0, 0.5, 0.7, 0.9)  # 0: what verifying alone costs
REAL = ["model=tiny_llama", "attention=cpu", "dtype=float32", "max_num_seqs=16",
        "max_num_batched_tokens=2048", "cpu_kv_cache_gb=0.05",  # no preemption: 100k tokens
        "cpu_threads=1"]  # one thread: a run shares this small machine with less to lose
SIM = ["executor=sim", "sim/step_time=roofline", "sim.device=h100", "model=hf",
       "max_num_batched_tokens=8192"]
PHRASE = 16  # tokens of the repetitive workload's phrase
# the model-based proposers of the real part: the target drafting for itself (speculative.model
# null: every draft accepted, at a full forward per draft) and the synthetic EAGLE head (the
# target cut after its first layer)
MODEL_PROPOSERS = ("draft", "eagle")
DRAFT_COST = 0.1  # simulated draft: a forward at a tenth of the target's decode step


class RepeatedPhrase(Workload):
    """A synthetic workload whose every prompt is the first `phrase_len` tokens of its own
    random prompt, repeated to its length: prompt lookup always finds the phrase again."""

    def __init__(self, base: SyntheticWorkload, phrase_len: int = PHRASE) -> None:
        self.base, self.phrase_len = base, phrase_len

    def requests(self, vocab_size: int, eos_token_id: int | None,
                 interpreted: bool = False) -> list[WorkloadRequest]:
        reqs = self.base.requests(vocab_size, eos_token_id, interpreted)
        for r in reqs:
            n, phrase = len(r.prompt_token_ids), r.prompt_token_ids[: self.phrase_len]
            r.prompt_token_ids = (phrase * (n // len(phrase) + 1))[:n]
        return reqs


class EveryToken(Workload):
    """Prompts that each hold every token id of the vocabulary (but EOS) in a random order: with
    prompt_lookup_min=1 the last token always occurred before, so every step drafts."""

    def __init__(self, base: SyntheticWorkload) -> None:
        self.base = base

    def requests(self, vocab_size: int, eos_token_id: int | None,
                 interpreted: bool = False) -> list[WorkloadRequest]:
        import numpy as np

        reqs = self.base.requests(vocab_size, eos_token_id, interpreted)
        ids = np.array([t for t in range(vocab_size) if t != eos_token_id])
        rng = np.random.default_rng(0)
        for r in reqs:
            r.prompt_token_ids = rng.permutation(ids).tolist()
        return reqs


def synthetic(n: int, prompt_len: int, output_len: int) -> SyntheticWorkload:
    """n random prompts of prompt_len tokens, output_len greedy outputs each, all at t=0."""
    return SyntheticWorkload(num_requests=n, prompt_len=prompt_len, output_len=output_len,
                             arrival="batch", num_prefix_groups=0, num_priorities=1, seed=0)


def spec_overrides(k: int, alpha: float | None = None, extra: tuple[str, ...] = (),
                   proposer: str = "ngram") -> list[str]:
    """The speculative option for k drafts (k = 0: off) and, simulated, its acceptance."""
    if k == 0:
        return ["speculative=none"]
    out = [f"speculative={proposer}", f"speculative.num_speculative_tokens={k}", *extra]
    if isinstance(alpha, float):
        out.append(f"sim.spec.acceptance_rate={alpha}")
    return out


def run_point(part: str, name: str, workload: Workload, k: int, overrides: list[str],
              jsonl_dir: Path | None = None) -> dict:
    """One run: its summary, the acceptance its steps counted and, real with drafts, what the
    ngram lookup alone costs a step of its requests."""
    cfg = compose_config([*overrides, "logger=[]", "seed=0"])
    proposer = next(o.split("=", 1)[1] for o in overrides if o.startswith("speculative="))
    start = time.perf_counter()
    engine = LLMEngine(cfg)
    steps = InMemoryLogger()
    engine.loggers.append(steps)
    jsonl = _jsonl(engine, jsonl_dir)
    try:
        reqs = workload.requests(engine.model_info.vocab_size, engine.eos_token_id)
        summary = replay(engine, reqs)
        if jsonl is not None:
            jsonl.close(summary)
        lookup = (lookup_ms(reqs, engine.model_info.vocab_size, cfg.speculative)
                  if k and part == "real" and proposer == "ngram" else "")
    finally:
        engine.shutdown()
    return {"part": part, "lookup_ms": lookup, "workload": name,
            "proposer": proposer,
            "requests": len(reqs), "k": k,
            "output_tok_s": round(summary.output_throughput, 1),
            "tpot_p50_ms": round(1e3 * (summary.tpot_p50 or 0), 2),
            "e2e_p50_s": round(summary.e2e_p50 or 0, 3), "steps": len(steps.steps),
            "decode_step_ms": round(1e3 * decode_step_seconds(steps.steps), 3),
            **acceptance(steps.steps, k), "wall_s": round(time.perf_counter() - start, 1)}


def lookup_ms(reqs: list[WorkloadRequest], vocab_size: int, option) -> float:
    """Milliseconds the ngram proposer takes for one step of these requests in the middle of
    their outputs (contexts: each prompt + half its max_tokens of random ids, which rarely
    match: the lookup tries every n), the median of 30 calls: the proposer's own cost, apart
    from the forward that verifies its drafts."""
    import numpy as np

    from lab.speculative.base import ProposeInputs, ProposerContext
    from lab.speculative.ngram import NgramProposer

    rng = np.random.default_rng(0)
    contexts = [r.prompt_token_ids + rng.integers(3, vocab_size, r.sampling_params.max_tokens
                                                   // 2).tolist() for r in reqs]
    width = max(len(c) for c in contexts)
    ids = np.zeros((len(reqs), width), dtype=np.int64)
    for i, c in enumerate(contexts):
        ids[i, : len(c)] = c
    k = option.num_speculative_tokens
    proposer = NgramProposer(ProposerContext(width + k, vocab_size), k,
                             option.prompt_lookup_min, option.prompt_lookup_max)
    inputs = ProposeInputs([str(i) for i in range(len(reqs))], ids, np.arange(len(reqs)),
                           np.array([len(c) for c in contexts]), np.full(len(reqs), k))
    times = []
    for _ in range(30):
        start = time.perf_counter()
        proposer.propose(inputs)
        times.append(time.perf_counter() - start)
    return round(1e3 * statistics.median(times), 3)


def decode_step_seconds(steps) -> float:
    """The median time of the steps without prompt tokens (decodes and verifications), end to
    end of the engine's loop: the cost of a step that emits; a median, so a moment of
    interference from another process does not move it."""
    times = [b.time - a.time for a, b in zip(steps, steps[1:]) if b.num_prefill_tokens == 0]
    return statistics.median(times) if times else 0.0


def _jsonl(engine: LLMEngine, run_dir: Path | None) -> JsonlLogger | None:
    """A jsonl logger writing the run's steps.jsonl into run_dir (None: none)."""
    if run_dir is None:
        return None
    logger = JsonlLogger()
    logger.on_start(run_dir)
    engine.loggers.append(logger)
    return logger


def acceptance(steps, k: int) -> dict:
    """Verifications, drafts, accepted drafts, their rate, the mean accepted per verification
    and the rate at each draft position (accepted there / verifications)."""
    n = sum(s.num_spec_reqs for s in steps)
    drafts = sum(s.num_draft_tokens for s in steps)
    accepted = sum(s.num_accepted_tokens for s in steps)
    per = [sum(s.accepted_per_position[j] for s in steps) / n if n else 0.0 for j in range(k)]
    return {"verifications": n, "drafts": drafts, "accepted": accepted,
            "acceptance": round(accepted / drafts, 4) if drafts else "",
            "mean_accepted": round(accepted / n, 3) if n else "",
            "per_position": " ".join(f"{p:.3f}" for p in per)}


def fastest(rows: list[dict]) -> dict:
    """Of a point's repeats, the fastest run (other processes on the machine only ever slow a
    run down), with the tokens/s of every repeat beside it."""
    best = max(rows, key=lambda r: r["output_tok_s"])
    return {**best, "repeats_tok_s": " ".join(str(r["output_tok_s"]) for r in rows)}


def add_speedups(rows: list[dict]) -> None:
    """Each row's tokens/s over its group's k=0 row (same part, workload and size)."""
    base = {(r["part"], r["workload"], r["requests"]): r["output_tok_s"]
            for r in rows if r["k"] == 0}
    for r in rows:
        off = base.get((r["part"], r["workload"], r["requests"]))
        r["speedup"] = round(r["output_tok_s"] / off, 3) if off else ""


def break_even(ratio: float, k: int) -> float:
    """The per-position acceptance alpha at which 1 + alpha + ... + alpha^k = ratio (the
    tokens a verification emits on average, geometric model), i.e. where a step costing
    `ratio` decode steps pays for itself; > 1 never pays (k + 1 tokens at most)."""
    if ratio <= 1:
        return 0.0
    if ratio > k + 1:
        return float("inf")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(mid ** j for j in range(k + 1)) < ratio else (lo, mid)
    return round(lo, 3)


def real_part(smoke: bool, repeats: int, measured_dir: Path) -> list[dict]:
    """tiny_llama on this CPU: the three workloads x k for ngram, and the model-based proposers
    on the repetitive and random ones; repeats interleaved."""
    n, prompt, output = (4, 64, 16) if smoke else (16, 128, 64)
    vocab_prompt = synthetic(n, prompt, output)
    workloads = {"repetitive": (RepeatedPhrase(synthetic(n, prompt, output)), ()),
                 "random": (synthetic(n, prompt, output), ()),
                 "probe": (EveryToken(vocab_prompt), ("speculative.prompt_lookup_min=1",))}
    ks = (0, 3) if smoke else KS
    points = [(name, "ngram", k) for name in workloads for k in ks]
    points += [(name, proposer, k) for name in ("repetitive", "random")
               for proposer in MODEL_PROPOSERS for k in ks if 0 < k <= 3]
    runs: dict[tuple[str, str, int], list[dict]] = {}
    for _ in range(repeats):
        for name, proposer, k in points:
            workload, extra = workloads[name]
            keep = measured_dir if (name, proposer, k) == ("repetitive", "ngram", max(ks)) else None
            row = run_point("real", name, workload, k,
                            [*REAL, *spec_overrides(k, extra=extra if proposer == "ngram" else (),
                                                    proposer=proposer)], keep)
            print_row(row)
            runs.setdefault((name, proposer, k), []).append(row)
    return [fastest(r) for r in runs.values()]


def simulated_part(smoke: bool, measured_dir: Path) -> list[dict]:
    """A Llama-3-8B shape on a simulated H100: batch sizes x k x alpha, and the CPU's measured
    acceptance."""
    sizes, output = ((8,), 64) if smoke else ((8, 64), 256)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = [*SIM, f"model.path={write_configs(tmp, ['llama3_8b'])['llama3_8b']}"]
        for n in sizes:
            work = synthetic(n, 512, output)
            for k in KS:
                for alpha in (ALPHAS if k else (None,)):
                    row = run_point("simulated", "llama3_8b", work, k,
                                    [*model, *spec_overrides(k, alpha)])
                    rows.append({**row, "alpha": alpha if alpha is not None else ""})
                    print_row(rows[-1])
            for k in KS[1:]:
                for alpha in ALPHAS[2:]:
                    row = run_point("simulated", "llama3_8b", work, k, [
                        *model, *spec_overrides(k, alpha, proposer="draft"),
                        f"sim.spec.draft_cost_ratio={DRAFT_COST}"])
                    rows.append({**row, "alpha": alpha})
                    print_row(rows[-1])
            if (measured_dir / "steps.jsonl").is_file():
                k = 3
                row = run_point("simulated", "llama3_8b", work, k,
                                [*model, *spec_overrides(k), "sim.spec.acceptance_from="
                                 f"{measured_dir}"])
                rows.append({**row, "alpha": "measured (CPU, repetitive)"})
                print_row(rows[-1])
    return rows


def print_row(row: dict) -> None:
    print(" ".join(f"{k}={row[k]}" for k in FIELDS if k in row), flush=True)


def table(rows: list[dict]) -> str:
    head = ("| part | workload | proposer | requests | k | alpha | output tok/s | speedup | TPOT p50 ms | "
            "E2E p50 s | steps | decode step ms | lookup ms | verifications | accepted / drafts | mean accepted | "
            "per position |")
    lines = [head, "|" + "---|" * 17]
    for r in rows:
        lines.append(
            f"| {r['part']} | {r['workload']} | {r['proposer']} | {r['requests']} | {r['k']} | "
            f"{r.get('alpha', '')} | {r['output_tok_s']} | {r['speedup']} | "
            f"{r['tpot_p50_ms']} | {r['e2e_p50_s']} | {r['steps']} | {r['decode_step_ms']} | "
            f"{r['lookup_ms']} | "
            f"{r['verifications']} | {r['accepted']} / {r['drafts']} | {r['mean_accepted']} | "
            f"{r['per_position']} |")
    return "\n".join(lines) + "\n"


def probe_lines(rows: list[dict]) -> list[str]:
    """What verifying k drafts costs on this CPU (probe: drafts every step) and the
    per-position acceptance at which it would pay."""
    probe = {r["k"]: r for r in rows if r["part"] == "real" and r["workload"] == "probe"
             and r["proposer"] in ("none", "ngram")}
    if 0 not in probe:
        return []
    out = []
    decode = probe[0]["decode_step_ms"]
    for k, r in sorted(probe.items()):
        if k:
            ratio = r["decode_step_ms"] / decode
            forward = (r["decode_step_ms"] - r["lookup_ms"]) / decode
            out.append(
                f"probe k={k}: a step verifying {k} draft(s) per request takes "
                f"{r['decode_step_ms']} ms, {ratio:.2f}x a decode step ({decode} ms): pays "
                f"{pays_at(ratio, k)}; without the ngram lookup ({r['lookup_ms']} ms of it) "
                f"{forward:.2f}x, pays {pays_at(forward, k)}; measured acceptance "
                f"{r['acceptance']}")
    return out


def pays_at(ratio: float, k: int) -> str:
    """Where a step costing `ratio` decode steps pays, in words."""
    alpha = break_even(ratio, k)
    if alpha == float("inf"):
        return "never (it costs more than the k + 1 tokens it can emit)"
    return f"at alpha >= {alpha}"


def header(argv: list[str]) -> str:
    """Date, commit, machine and the command, for the committed table."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in
                subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
                if line.startswith("Model name")), "unknown")
    import torch

    return (f"Run {date.today()} at commit {commit} on {cpu} ({os.cpu_count()} CPUs), torch "
            f"{torch.__version__}; command: `python experiments/speculative/run.py"
            f"{' ' + ' '.join(argv) if argv else ''}`\n")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["k"] == 0:
            continue
        if r["part"] == "real":
            groups.setdefault(("real, CPU, tiny_llama",
                               f"{r['workload']}, {r['proposer']}"), []).append(r)
        elif r["alpha"] != "" and not str(r["alpha"]).startswith("measured"):
            groups.setdefault((f"simulated H100, Llama-3-8B, {r['requests']} requests",
                               f"{r['proposer']}, alpha {r['alpha']}"), []).append(r)
    panels = list(dict.fromkeys(g[0] for g in groups))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for (p, label), points in groups.items():
            if p != panel:
                continue
            off = [r for r in rows if r["k"] == 0 and r["part"] == points[0]["part"]
                   and r["workload"] == points[0]["workload"]
                   and r["requests"] == points[0]["requests"]]
            pts = sorted(({r["k"]: r for r in off + points}).values(), key=lambda r: r["k"])
            ax.plot([r["k"] for r in pts], [r["speedup"] or 0 for r in pts], marker="o",
                    label=label)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel("drafts per step k (0: off)")
        ax.set_ylabel("output tok/s over k=0")
        ax.legend(fontsize=7)
    fig.suptitle("speculative decoding: throughput vs k")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="fewer requests and points: ~20 s")
    p.add_argument("--out", type=Path, default=None,
                   help="default: results/ (--smoke: outputs/speculative-smoke/)")
    p.add_argument("--parts", nargs="*", default=["real", "simulated"],
                   choices=["real", "simulated"])
    p.add_argument("--repeats", type=int, default=3,
                   help="real runs per point, interleaved; the fastest reported (--smoke: 1)")
    args = p.parse_args(argv)
    out = args.out or (ROOT / "outputs" / "speculative-smoke" if args.smoke else HERE / "results")
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as measured:
        measured_dir = Path(measured)
        if "real" in args.parts:
            rows += real_part(args.smoke, 1 if args.smoke else args.repeats, measured_dir)
        if "simulated" in args.parts:
            rows += simulated_part(args.smoke, measured_dir)
    add_speedups(rows)
    with open(out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    text = header(argv) + "\n" + table(rows) + "\n" + "\n".join(
        f"- {line}" for line in probe_lines(rows)) + "\n"
    (out / "table.md").write_text(text)
    plot(rows, out / "speculative.png")
    print(text)
    print(f"written: {out}")


if __name__ == "__main__":
    main()
