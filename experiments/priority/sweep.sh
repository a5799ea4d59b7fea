#!/usr/bin/env bash
# Queue policies under rising load: fcfs, priority, sjf, fair x 4 Poisson request rates.
# 500 requests in 3 priority classes (0 = most important) from 3 clients, on a KV cache of
# 32 blocks x 16 tokens, so that the two higher rates overload the engine on a 2-core CPU.
# Extra Hydra overrides are passed through, e.g.  bash experiments/priority/sweep.sh model=tiny_qwen3
#   then: python experiments/priority/plot.py <sweep dir> --out experiments/priority/results/
set -euo pipefail
cd "$(dirname "$0")/../.."
# One intra-op thread: the tiny model is overhead-bound, and a shared 2-core machine slows a
# 2-thread torch badly whenever another process holds a core. Harmless on a GPU.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
dir="experiments/priority/runs/$(date +%Y-%m-%d_%H-%M-%S)"
python run.py -m \
  scheduler=fcfs,priority,sjf,fair \
  workload.arrival=poisson workload.rate=20,40,60,80 \
  workload.num_requests=500 workload.num_priorities=3 workload.num_clients=3 \
  num_gpu_blocks=32 block_size=16 \
  logger=[jsonl] \
  hydra.sweep.dir="$dir" \
  "$@"
echo "sweep dir: $dir"
