"""Engine overhead per step with no model: schedule() + update_from_output() on a trace.

    python -m lab.bench.overhead                      # 1000 requests, 4 arrivals per step
    python -m lab.bench.overhead --requests 2000 --max-num-seqs 512

The trace follows the vLLM comparison in the engine issue: prompts uniform in [32, 512], outputs
uniform in [16, 256], 4 arrivals per step, max_num_seqs 256, greedy, ignore_eos. The executor is
`SimExecutor` (no model), so the time is the scheduler + KV-cache manager + request bookkeeping.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from lab.cache.hashing import make_block_hasher
from lab.cache.manager import KVCacheManager
from lab.engine.request import Request
from lab.executor.sim import SimExecutor
from lab.sampling.params import SamplingParams
from lab.scheduler import FCFSQueue, RecomputePreemption, Scheduler, SchedulerConfig


def make_trace(n: int, seed: int, vocab: int = 32000) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(3, vocab) for _ in range(rng.randint(32, 512))], rng.randint(16, 256))
            for _ in range(n)]


def run(args: argparse.Namespace) -> dict[str, float]:
    kv = KVCacheManager(args.num_blocks, args.block_size, args.max_model_len, enable_caching=True)
    sched = Scheduler(SchedulerConfig(args.max_num_seqs, args.max_num_batched_tokens,
                                      args.max_model_len), kv, FCFSQueue(), RecomputePreemption())
    executor = SimExecutor(args.num_blocks)
    hasher = make_block_hasher(args.block_size)
    trace = make_trace(args.requests, args.seed)
    times, batch = [], []
    i = 0
    while i < len(trace) or sched.has_unfinished_requests():
        for prompt, out_len in trace[i: i + args.arrivals_per_step]:
            sp = SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True)
            sched.add_request(Request(str(i), prompt, sp, None, time.perf_counter(),
                                      block_hasher=hasher))
            i += 1
        t0 = time.perf_counter()
        out = sched.schedule()
        t1 = time.perf_counter()
        result = executor.execute_model(out)
        t2 = time.perf_counter()
        sched.update_from_output(out, result)
        t3 = time.perf_counter()
        times.append((t1 - t0) + (t3 - t2))
        batch.append(len(out.num_scheduled_tokens))
    return {"steps": len(times), "mean_batch": statistics.mean(batch),
            "mean_ms": 1e3 * statistics.mean(times), "p50_ms": 1e3 * statistics.median(times),
            "p99_ms": 1e3 * sorted(times)[int(0.99 * (len(times) - 1))],
            "total_s": sum(times)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--arrivals-per-step", type=int, default=4)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=16384)
    p.add_argument("--seed", type=int, default=0)
    r = run(p.parse_args())
    print(f"steps {r['steps']}  mean batch {r['mean_batch']:.1f}  schedule+update per step: "
          f"mean {r['mean_ms']:.2f} ms  p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms  "
          f"(total {r['total_s']:.2f} s)")


if __name__ == "__main__":
    main()
