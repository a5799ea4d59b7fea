#!/usr/bin/env bash
# A W&B sweep file run offline as the equivalent Hydra multirun, then plotted.
#   bash experiments/sweeps/multirun.sh experiments/sweeps/cpu_small.yaml [OVERRIDE ...]
# e.g. with another model:  bash experiments/sweeps/multirun.sh experiments/sweeps/cpu_small.yaml model=tiny_qwen3
set -euo pipefail
cd "$(dirname "$0")/../.."
# One intra-op thread: the tiny models are overhead-bound, and a shared 2-core machine slows a
# 2-thread torch badly whenever another process holds a core. Harmless on a GPU.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
sweep="${1:?usage: multirun.sh SWEEP.yaml [OVERRIDE ...]}"
shift
log=$(mktemp)
python experiments/sweeps/multirun.py "$sweep" "$@" | tee "$log"
dir=$(sed -n 's/^sweep dir: //p' "$log")
rm -f "$log"
python -m lab.plots "$dir" --out "$dir/plots"
