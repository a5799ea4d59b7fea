#!/usr/bin/env bash
# Preemption strategies as the KV cache shrinks: recompute, swap, reserve x 5 cache sizes.
# 300 requests at 40 req/s (Poisson) — more than the engine serves at once on a 2-core CPU — so
# a small cache forces preemption (or, under reserve, admission control).
# Extra Hydra overrides are passed through, e.g.  bash experiments/preemption/sweep.sh model=tiny_qwen3
#   then: python experiments/preemption/plot.py <sweep dir> --out experiments/preemption/results/
set -euo pipefail
cd "$(dirname "$0")/../.."
# One intra-op thread: the tiny model is overhead-bound, and a shared 2-core machine slows a
# 2-thread torch badly whenever another process holds a core. Harmless on a GPU.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
dir="experiments/preemption/runs/$(date +%Y-%m-%d_%H-%M-%S)"
python run.py -m \
  preemption=recompute,swap,reserve \
  num_gpu_blocks=24,32,48,64,128 block_size=16 \
  workload.num_requests=300 workload.arrival=poisson workload.rate=40 \
  logger=[jsonl] \
  hydra.sweep.dir="$dir" \
  "$@"
echo "sweep dir: $dir"
