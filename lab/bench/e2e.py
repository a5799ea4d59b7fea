"""End-to-end offline throughput of engine configurations on one model, nano-vllm's shape.

    python -m lab.bench.e2e                                   # triton_flash vs torch, CUDA, bf16
    python -m lab.bench.e2e --runs attention=triton_flash attention=triton_flash,quant=fp8 \
        attention=triton_flash,quant=int8 attention=triton_flash,quant=w4a16

Each run is a comma-separated list of LLM keywords (group options or knobs, as on the command
line of run.py); the first run is the baseline of the ratio column.

nano-vllm's benchmark: 256 sequences, input and output lengths uniform in [100, 1024], seed 0,
ignore_eos, random weights. The model is the Qwen3-0.6B-width preset (`bench_qwen3_06b`: hidden
1024, 16/8 heads, head_dim 128, ffn 3072; 12 layers and a 16k vocabulary rather than 28 layers
and 152k). Each backend runs in its own engine on the same prompts; prints output tok/s each and
the ratio. Needs lab's full dependencies (Hydra); on CPU use --num-seqs 4 --max-len 64.

On CUDA each run also gets its memory-bandwidth floor: no engine can finish faster than reading
every weight once per decode step (at least as many steps as the longest output) plus every
output token's context from the KV cache once, at the device's copy bandwidth (measured in the
same process by lab.bench.kernels.copy_bandwidth: a device-to-device copy, bytes read + written).
`floor tok/s` is the output tokens over that time, `of floor` the measured tok/s over it.
"""

from __future__ import annotations

import argparse
import random

import torch
import yaml

from lab import SamplingParams
from lab.bench.kernels import copy_bandwidth
from lab.bench.workload import bench_llm, checkpoint, free_memory, timed_generate, vocab_size


def make_requests(n: int, lo: int, hi: int, vocab: int, seed: int):
    """nano-vllm's requests: n prompts of random ids and output lengths, both uniform in
    [lo, hi] (Python's random, seeded), sampled at temperature 0.6 with ignore_eos."""
    rng = random.Random(seed)
    prompts = [[rng.randint(3, vocab - 1) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
    params = [SamplingParams(temperature=0.6, max_tokens=rng.randint(lo, hi), ignore_eos=True,
                             seed=i) for i in range(n)]
    return prompts, params


def parse_run(spec: str) -> dict[str, object]:
    """'attention=triton_flash,compile=true' -> {'attention': 'triton_flash', 'compile': True}
    (values read as YAML scalars, as on run.py's command line)."""
    items = [kv for kv in spec.split(",") if kv]
    if not items or any("=" not in kv for kv in items):
        raise SystemExit(f"--runs {spec!r}: expected KEY=VALUE[,KEY=VALUE...]")
    return {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in items)}


def floor_seconds(prompts, params, weight_bytes: int, kv_bytes_per_token: float,
                  bandwidth: float) -> float:
    """The bandwidth floor of one run: weights read once per decode step (>= the longest output
    steps), each output token's context (prompt + earlier outputs) read once from the cache."""
    steps = max(p.max_tokens for p in params)
    context = sum(len(x) * p.max_tokens + p.max_tokens * (p.max_tokens - 1) // 2
                  for x, p in zip(prompts, params))
    return (steps * weight_bytes + context * kv_bytes_per_token) / bandwidth


def run_config(spec: str, args, prompts, params) -> tuple[float, int, float]:
    """(seconds, output tokens, floor seconds) of one --runs configuration in its own engine."""
    llm = bench_llm(args.model, args.dtype, args.max_num_seqs, args.max_num_batched_tokens,
                    **parse_run(spec))
    try:
        seconds, outs = timed_generate(llm, prompts, params, SamplingParams(max_tokens=4))
        eng = llm.engine
        floor = (floor_seconds(prompts, params, eng.weight_bytes, eng.kv_bytes_per_token,
                               args.bandwidth)
                 if args.bandwidth else float("nan"))
        return seconds, sum(len(o.outputs[0].token_ids) for o in outs), floor
    finally:
        llm.engine.shutdown()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="bench_qwen3_06b")
    p.add_argument("--runs", nargs="+", default=["attention=triton_flash", "attention=torch"],
                   help="engine configurations, each KEY=VALUE[,KEY=VALUE...]")
    p.add_argument("--num-seqs", type=int, default=256)
    p.add_argument("--min-len", type=int, default=100)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--max-num-seqs", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    prompts, params = make_requests(args.num_seqs, args.min_len, args.max_len,
                                    vocab_size(checkpoint(args.model)), args.seed)
    args.bandwidth = copy_bandwidth() if torch.cuda.is_available() else 0.0
    results = {}
    for r in args.runs:
        results[r] = run_config(r, args, prompts, params)
        free_memory()  # the next run's KV sizing must see this run's cache freed
    base_t, base_n, _ = results[args.runs[0]]
    width = max(len(r) for r in args.runs) + 2
    print(f"\nmodel {args.model}  seqs {args.num_seqs}  lengths U[{args.min_len}, {args.max_len}]"
          + (f"  copy bandwidth {args.bandwidth / 1e12:.2f} TB/s" if args.bandwidth else ""))
    print(f"{'run':<{width}}{'seconds':>10}{'output tok/s':>15}{'vs first':>10}"
          f"{'floor tok/s':>14}{'of floor':>10}")
    for r, (t, n, floor) in results.items():
        print(f"{r:<{width}}{t:>10.2f}{n / t:>15.1f}{(n / t) / (base_n / base_t):>10.2f}"
              f"{n / floor:>14.0f}{floor / t:>10.2f}")


if __name__ == "__main__":
    main()
