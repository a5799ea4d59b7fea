#!/usr/bin/env bash
# The one prepared device check (run on a lent GPU machine from the repo root):
#   1. installs the carried wheels (scripts/gpu_wheels.sh made them) without network,
#   2. runs the CUDA correctness tests (pytest -m gpu: bf16/fp8 for every kernel, quant methods),
#   3. times every kernel against its ceiling and PyTorch (python3 -m lab.bench.kernels),
#   4. runs the end-to-end comparisons (python3 -m lab.bench.e2e): backends, quant methods,
#      async scheduling vs sync (and its CUDA parity test), compile=true vs eager (and its test),
#   5. on a machine with 2+ GPUs: TP=2 (NCCL, executor=multiproc) correctness and TP=1 vs TP=2 e2e,
#   6. micro-batching (docs/ubatch.md): its CUDA tests, then one step's forward as one batch vs two
#      micro-batches (in turn; interleaved at the all-reduces), TP=1 and, on 2+ GPUs, TP=2,
#   7. CUDA graphs of decode steps: capture/replay parity tests, then a decode step with graphs vs
#      eager at batch 1/8/64 on bench_qwen3_06b (python3 -m lab.bench.cudagraph).
# Output goes to $OUT (the device tool returns it) or experiments/results/gpu-<date>/.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-experiments/results/gpu-$(date +%Y%m%d-%H%M)}
mkdir -p "$OUT"
if [ -d wheels ]; then  # no registry there: install the carried wheels beside the image's packages
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site wheels/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; git rev-parse HEAD 2>/dev/null
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
  > "$OUT/machine.txt" 2>&1
# only the folders with gpu-marked tests: the others import loggers (wandb, prometheus) the
# device image lacks
python3 -m pytest tests/kernels tests/quant -m gpu -q -p no:cacheprovider 2>&1 | tail -30 \
  > "$OUT/gpu_tests.txt"
python3 -m lab.bench.kernels 2>&1 | tail -40 > "$OUT/kernels.txt"
python3 -m lab.bench.e2e 2>&1 | tail -6 > "$OUT/e2e.txt"
python3 -m lab.bench.e2e --runs attention=triton_flash attention=triton_flash,quant=fp8 \
  attention=triton_flash,quant=int8 attention=triton_flash,quant=w4a16 2>&1 | tail -8 >> "$OUT/e2e.txt"
# async scheduling (schedule step N+1 while N runs): its CUDA parity test, then tok/s vs sync
python3 -m pytest tests/engine/test_async_scheduling.py -m gpu -q -p no:cacheprovider 2>&1 \
  | tail -3 >> "$OUT/e2e.txt"
python3 -m lab.bench.e2e --runs attention=triton_flash attention=triton_flash,async_scheduling=true \
  2>&1 | tail -5 >> "$OUT/e2e.txt"
# compile=true (docs/compile.md): its CUDA parity test, then tok/s vs eager
python3 -m pytest tests/compile -m gpu -q -p no:cacheprovider 2>&1 | tail -3 >> "$OUT/e2e.txt"
python3 -m lab.bench.e2e --runs attention=triton_flash attention=triton_flash,compile=true \
  2>&1 | tail -5 >> "$OUT/e2e.txt"
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$ngpu" -ge 2 ]; then
  python3 -m pytest tests/executor -m gpu -q -p no:cacheprovider 2>&1 | tail -10 > "$OUT/tp.txt"
  python3 -m lab.bench.e2e --runs attention=triton_flash \
    attention=triton_flash,executor=multiproc,tensor_parallel_size=2 2>&1 | tail -6 >> "$OUT/tp.txt"
else
  echo "TP=1 vs TP=2 rows skipped: $ngpu GPU(s) here, they need 2" > "$OUT/tp.txt"
fi
python3 -m pytest tests/worker/test_ubatch.py -m gpu -q -p no:cacheprovider 2>&1 | tail -5 \
  > "$OUT/ubatch.txt"
python3 -m lab.bench.ubatch 2>&1 | tail -12 >> "$OUT/ubatch.txt"
python3 -m pytest tests/worker/test_cudagraph.py -m gpu -q -p no:cacheprovider 2>&1 | tail -5 \
  > "$OUT/cudagraph.txt"
python3 -m lab.bench.cudagraph 2>&1 | tail -6 >> "$OUT/cudagraph.txt"
cat "$OUT/machine.txt" "$OUT/gpu_tests.txt" "$OUT/e2e.txt" "$OUT/tp.txt" "$OUT/ubatch.txt" \
  "$OUT/cudagraph.txt" "$OUT/kernels.txt"
