"""Prefix-cache hits of recompute vs swap under a long scheduler-level soak (no model).

    python experiments/preemption/soak_prefix_hits.py            # 3000 requests, ~40 s
    python experiments/preemption/soak_prefix_hits.py --requests 10000

The real Scheduler and KVCacheManager with a stand-in executor (every request whose prompt is
caught up gets token 5): 64 shared 128-token prefixes plus 16-256 own tokens, 16-256 output
tokens, two arrivals per step, 400 blocks of 16 tokens, a 1 GiB swap space. Prints, per
strategy, the prefix-cache lookups, queried and hit tokens, and for swap how many swapped blocks
came back copied vs still cached on the device.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from lab.cache.hashing import make_block_hasher  # noqa: E402
from lab.cache.manager import KVCacheManager  # noqa: E402
from lab.core.request import Request  # noqa: E402
from lab.core.sampling_params import SamplingParams  # noqa: E402
from lab.core.step import ModelRunnerOutput  # noqa: E402
from lab.scheduler import FCFSQueue, RecomputePreemption, Scheduler, SchedulerConfig  # noqa: E402
from lab.scheduler.preemption import PreemptionStrategy, SwapPreemption  # noqa: E402

VOCAB, BLOCK = 32000, 16


def soak(strategy: PreemptionStrategy, n: int, blocks: int, seed: int) -> dict[str, int]:
    kv = KVCacheManager(blocks, BLOCK, 2048, True, swap_space_gb=1.0, bytes_per_block=1024)
    s = Scheduler(SchedulerConfig(64, 1024, 2048), kv, FCFSQueue(), strategy)
    rng, hasher = random.Random(seed), make_block_hasher(BLOCK)
    prefixes = [[rng.randrange(3, VOCAB) for _ in range(128)] for _ in range(64)]
    copied = reclaimed = i = 0
    while i < n or s.has_unfinished_requests():
        for _ in range(2):
            if i < n:
                own = [rng.randrange(3, VOCAB) for _ in range(rng.randint(16, 256))]
                sp = SamplingParams(temperature=0, max_tokens=rng.randint(16, 256), ignore_eos=True)
                s.add_request(Request(str(i), prefixes[rng.randrange(64)] + own, sp, None, 0.0,
                                      block_hasher=hasher))
                i += 1
        out = s.schedule()
        done = {rid: 5 for rid in out.num_scheduled_tokens
                if s.requests[rid].num_computed_tokens >= s.requests[rid].num_tokens}
        s.update_from_output(out, ModelRunnerOutput(done))
        copied += len(out.swap_in)
        reclaimed += getattr(s.events, "swap_in_cached_blocks", 0)  # 0 before the swap fix
    t = kv.prefix_cache_totals
    return {"lookups": t.requests, "queried_tokens": t.queries, "hit_tokens": t.hits,
            "swap_in_copied": copied, "swap_in_cached": reclaimed}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--blocks", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    for strategy in (RecomputePreemption(), SwapPreemption()):
        r = soak(strategy, args.requests, args.blocks, args.seed)
        print(f"{strategy.name:9s} " + "  ".join(f"{k} {v}" for k, v in r.items()), flush=True)


if __name__ == "__main__":
    main()
