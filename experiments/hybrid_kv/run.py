"""The hybrid KV cache's capacity gain: long prompts (many times the window) on sliding-window
models, with the blocks that leave a window freed (cache.hybrid=true, the default) and without
(cache.hybrid=false: every layer keeps its whole context, vLLM's
--disable-hybrid-kv-cache-manager), at the same KV memory. One command:

    python experiments/hybrid_kv/run.py                 # real on this CPU + simulated on an H100
    python experiments/hybrid_kv/run.py --smoke         # a minute: fewer requests

Two parts:
  real       tiny_mistral_sw (every layer slides over 16 tokens) and tiny_gpt_oss (sliding and
             full layers alternate, 16-token window) on this CPU, attention=cpu, a fixed KV
             budget (cpu_kv_cache_gb=0.0005: room for 3 of these requests with every block
             kept), 32 prompts of 256 tokens (16x the window) + 32 outputs, all at t=0,
             at most 256 tokens a step.
  simulated  config-only Mistral-7B (4096-token window), Gemma-3-12B (5 local layers of 1024
             tokens to 1 global) and gpt-oss-20b (128-token window on every other layer) on a
             simulated H100 (sim/step_time=roofline: data-sheet peaks x guessed efficiencies,
             uncalibrated), 256 prompts of 16k tokens + 256 outputs, all at t=0.

Per point: KV blocks and bytes per block, the longest request the cache admits
(max_model_len), the most KV bytes in use at once, the most requests running at once,
preemptions, output tokens/s and TTFT p50. Writes results/summary.csv, results/table.md and
results/capacity.png.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root: run as a script from anywhere

from lab.config.compose import compose_config  # noqa: E402
from lab.engine.llm_engine import LLMEngine  # noqa: E402
from lab.engine.replay import replay  # noqa: E402
from lab.sim.configs import write_configs  # noqa: E402
from lab.workloads.synthetic import SyntheticWorkload  # noqa: E402

FIELDS = ("part", "model", "hybrid", "kv_groups", "num_blocks", "bytes_per_block",
          "max_model_len", "peak_kv_mib", "max_running", "num_preemptions", "output_throughput",
          "ttft_p50", "wall_s")

REAL = {  # model -> overrides (attention=cpu: the fastest on a CPU)
    "tiny_mistral_sw": [],
    "tiny_gpt_oss": [],
}
REAL_COMMON = ["attention=cpu", "dtype=float32", "block_size=16", "max_num_seqs=32",
               "max_num_batched_tokens=256", "cpu_kv_cache_gb=0.0005", "warmup=false",
               "cpu_threads=1"]
SIMULATED = ("mistral_7b", "gemma3_12b", "gpt_oss_20b")
SIM_COMMON = ["executor=sim", "sim/step_time=roofline", "sim.device=h100", "model=hf",
              "max_num_seqs=256", "max_num_batched_tokens=8192", "block_size=16"]


def workload(n: int, prompt_len: int, output_len: int) -> SyntheticWorkload:
    """`n` prompts of `prompt_len` tokens, `output_len` outputs each, all at t=0 (no shared
    prefixes: each request's blocks are its own)."""
    return SyntheticWorkload(
        num_requests=n, prompt_len=prompt_len, output_len=output_len, arrival="batch",
        num_prefix_groups=0, num_priorities=1, seed=0)


def run_point(part: str, model: str, overrides: list[str], hybrid: bool, n: int,
              prompt_len: int, output_len: int) -> dict:
    cfg = compose_config([*overrides, f"cache.hybrid={str(hybrid).lower()}", "logger=[]",
                          "seed=0"])
    start = time.perf_counter()
    engine = LLMEngine(cfg)
    try:
        reqs = workload(n, prompt_len, output_len).requests(engine.model_info.vocab_size,
                                                            engine.eos_token_id)
        summary = replay(engine, reqs).to_dict()
        steps = list(engine.recent_steps)
        info, kv = engine.model_info, engine.scheduler.kv
        row = {
            "part": part, "model": model, "hybrid": hybrid, "kv_groups": kv.num_groups,
            "num_blocks": kv.num_blocks - 1, "bytes_per_block": info.bytes_per_block,
            "max_model_len": engine.scheduler.config.max_model_len,
            "peak_kv_mib": round(max(s.kv_blocks_used for s in steps) * info.bytes_per_block
                                 / 2**20, 3),
            "max_running": max(s.num_running_reqs for s in steps),
            "num_preemptions": summary["num_preemptions"],
            "output_throughput": round(summary["output_throughput"], 1),
            "ttft_p50": round(summary["ttft_p50"], 3),
            "wall_s": round(time.perf_counter() - start, 1),
        }
    finally:
        engine.shutdown()
    print(" ".join(f"{k}={row[k]}" for k in FIELDS), flush=True)
    return row


def table(rows: list[dict]) -> str:
    head = ("| part | model | hybrid | groups | blocks x bytes | max_model_len | peak KV MiB | "
            "max running | preemptions | output tok/s | TTFT p50 s |")
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        lines.append(
            f"| {r['part']} | {r['model']} | {r['hybrid']} | {r['kv_groups']} | "
            f"{r['num_blocks']} x {r['bytes_per_block']} | {r['max_model_len']} | "
            f"{r['peak_kv_mib']} | {r['max_running']} | {r['num_preemptions']} | "
            f"{r['output_throughput']} | {r['ttft_p50']} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((axes[0], "max_running", "most requests running at once"),
                           (axes[1], "output_throughput", "output tokens/s")):
        for i, hybrid in enumerate((False, True)):
            values = [next(r[key] for r in rows if r["model"] == m and r["hybrid"] == hybrid)
                      for m in models]
            ax.bar([x + 0.4 * i for x in range(len(models))], values, width=0.4,
                   label="hybrid (window blocks freed)" if hybrid else "hybrid off")
        ax.set_xticks([x + 0.2 for x in range(len(models))],
                      [f"{m}\n({'real, CPU' if m.startswith('tiny') else 'sim, H100'})"
                       for m in models], fontsize=7)
        ax.set_ylabel(label)
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    fig.suptitle("Same KV memory, long prompts: blocks outside the window freed or kept")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="fewer requests: a minute")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--parts", nargs="*", default=["real", "simulated"],
                   choices=["real", "simulated"])
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    if "real" in args.parts:
        n = 8 if args.smoke else 32
        for model, extra in REAL.items():
            for hybrid in (False, True):
                rows.append(run_point("real", model, [f"model={model}", *REAL_COMMON, *extra],
                                      hybrid, n, 256, 32))
    if "simulated" in args.parts:
        n = 32 if args.smoke else 256
        with tempfile.TemporaryDirectory() as tmp:
            dirs = write_configs(tmp, list(SIMULATED))
            for model in SIMULATED:
                for hybrid in (False, True):
                    rows.append(run_point("simulated", model,
                                          [*SIM_COMMON, f"model.path={dirs[model]}"],
                                          hybrid, n, 16384, 256))
    with open(args.out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    (args.out / "table.md").write_text(table(rows))
    plot(rows, args.out / "capacity.png")
    print(table(rows))


if __name__ == "__main__":
    main()
