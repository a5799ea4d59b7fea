"""End-to-end offline throughput of two attention backends on one model, nano-vllm's shape.

    python -m lab.bench.e2e                                   # bench_qwen3_06b, CUDA, bf16
    python -m lab.bench.e2e --backends triton_flash torch --num-seqs 256

nano-vllm's benchmark: 256 sequences, input and output lengths uniform in [100, 1024], seed 0,
ignore_eos, random weights. The model is the Qwen3-0.6B-width preset (`bench_qwen3_06b`: hidden
1024, 16/8 heads, head_dim 128, ffn 3072; 12 layers and a 16k vocabulary rather than 28 layers
and 152k). Each backend runs in its own engine on the same prompts; prints output tok/s each and
the ratio. Needs lab's full dependencies (Hydra); on CPU use --num-seqs 4 --max-len 64.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from lab import LLM, SamplingParams


def make_requests(n: int, lo: int, hi: int, vocab: int, seed: int):
    rng = random.Random(seed)
    prompts = [[rng.randint(3, vocab - 1) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
    params = [SamplingParams(temperature=0.6, max_tokens=rng.randint(lo, hi), ignore_eos=True,
                             seed=i) for i in range(n)]
    return prompts, params


def run_backend(backend: str, args, prompts, params) -> tuple[float, int]:
    llm = LLM(args.model, attention=backend, dtype=args.dtype,
              max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs)
    llm.generate([prompts[0][:16]], SamplingParams(max_tokens=4))  # warm-up (kernel compiles)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0, sum(len(o.outputs[0].token_ids) for o in outs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="bench_qwen3_06b")
    p.add_argument("--backends", nargs="+", default=["triton_flash", "torch"])
    p.add_argument("--num-seqs", type=int, default=256)
    p.add_argument("--min-len", type=int, default=100)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--max-num-seqs", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    prompts, params = make_requests(args.num_seqs, args.min_len, args.max_len, 16384, args.seed)
    results = {b: run_backend(b, args, prompts, params) for b in args.backends}
    first = args.backends[0]
    print(f"\nmodel {args.model}  seqs {args.num_seqs}  lengths U[{args.min_len}, {args.max_len}]")
    print(f"{'attention':<16}{'seconds':>10}{'output tok/s':>15}{'vs ' + first:>12}")
    for b, (t, n) in results.items():
        print(f"{b:<16}{t:>10.2f}{n / t:>15.1f}{(n / t) / (results[first][1] / results[first][0]):>12.2f}")


if __name__ == "__main__":
    main()
