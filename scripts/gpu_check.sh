#!/usr/bin/env bash
# The one prepared device check (run on a lent GPU machine from the repo root):
#   scripts/gpu_check.sh [PART ...]      # default: every part but `features`, in this order
# Parts (each under its own time limit, so one that hangs or fails leaves the others' rows):
#   cudagraph  CUDA-graph capture/replay parity tests, then a decode step with graphs vs eager at
#              batch 1/8/64 on bench_qwen3_06b (python3 -m lab.bench.cudagraph)
#   e2e        end-to-end output tok/s against the (weights + KV bytes) / bandwidth floor
#              (python3 -m lab.bench.e2e): graphs vs enforce_eager, async scheduling vs sync
#              (+ its CUDA parity test)
#   tests      the CUDA correctness tests (pytest -m gpu: bf16/fp8 for every kernel, quant methods)
#   quant      e2e of the quant methods (fp8, int8, w4a16) against bf16
#   compile    compile=true: its CUDA parity test, then tok/s vs eager
#   kernels    every kernel timed against its ceiling and PyTorch (python3 -m lab.bench.kernels)
#   features   the attention features (sliding window, sinks, soft cap) alone, for a short
#              device budget: their CUDA tests (bf16 decode and prefill against the references,
#              keys outside the window NaN), then their kernel rows after the plain rows 1 and 7
#              (python3 -m lab.bench.kernels --features); not in the default run, whose `tests`
#              and `kernels` parts hold the same tests and rows
#   ubatch     micro-batching (docs/ubatch.md): its CUDA tests, one step's forward as one batch vs
#              two micro-batches (in turn; interleaved at the all-reduces)
#   tp         on a machine with 2+ GPUs: TP=2 (NCCL, executor=multiproc) correctness, TP=1 vs 2
#   speculative  speculative=ngram (k = 3 and 5) vs off on bench_qwen3_06b, triton_flash: run.py's
#              summaries, each run's steps.jsonl under $OUT/speculative/ (measured acceptance for
#              `sim.spec.acceptance_from`), then lab.bench.e2e's random prompts at temperature
#              0.6 (the rejection sampler's random path) off vs ngram; random weights accept few
#              drafts, so these time what verifying costs on the GPU more than what it buys
#   simprofile the simulator's operator profile of bench_qwen3_06b on this GPU (python3 -m
#              lab.sim.profile, eager: the timers see each operator), written beside the logs as
#              sim_profile_bench_qwen3_06b.json: `sim/step_time=profiled sim.step_time.path=THAT
#              sim.device=h100|h200` then simulates this GPU measured instead of the roofline
# Each part writes its whole log to $OUT/<part>.txt; the summary at the end prints their tails.
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
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
  git rev-parse HEAD 2>/dev/null
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
  > "$OUT/machine.txt" 2>&1

# run LIMIT_S CMD...: one command of a part, interrupted after LIMIT_S seconds (SIGINT: pytest
# still prints its failures and summary; killed 15 s later), the part goes on
run() { local limit=$1; shift; echo "\$ $*"; timeout -s INT -k 15 "$limit" "$@" 2>&1; local rc=$?
        [ $rc -eq 124 ] && echo "[interrupted at the ${limit} s limit]"
        [ $rc -eq 0 ] || echo "[exit $rc]"; }
# only the folders with gpu-marked tests: the others import loggers (wandb, prometheus) the
# device image lacks
gpu_tests() { local limit=$1; shift
              run "$limit" python3 -m pytest "$@" -m gpu -v -p no:cacheprovider --tb=short -rfE; }

part_cudagraph() {
  gpu_tests 150 tests/worker/test_cudagraph.py
  run 200 python3 -m lab.bench.cudagraph
}
part_e2e() {
  run 200 python3 -m lab.bench.e2e --runs attention=triton_flash \
    attention=triton_flash,enforce_eager=true attention=triton_flash,async_scheduling=true
  gpu_tests 120 tests/engine/test_async_scheduling.py
}
part_tests() { gpu_tests 300 tests/kernels tests/quant tests/sampling; }
part_quant() {
  run 200 python3 -m lab.bench.e2e --runs attention=triton_flash attention=triton_flash,quant=fp8 \
    attention=triton_flash,quant=int8 attention=triton_flash,quant=w4a16
}
part_compile() {
  gpu_tests 240 tests/compile
  run 300 python3 -m lab.bench.e2e --runs attention=triton_flash \
    attention=triton_flash,compile=true
}
part_kernels() { run 300 python3 -m lab.bench.kernels; }
part_features() {
  gpu_tests 200 tests/kernels/test_kernel_paged_decode.py tests/kernels/test_kernel_paged_prefill.py \
    -k features
  run 240 python3 -m lab.bench.kernels --features
}
part_ubatch() {
  gpu_tests 120 tests/worker/test_ubatch.py
  run 120 python3 -m lab.bench.ubatch
}
part_tp() {
  local ngpu; ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
  if [ "$ngpu" -lt 2 ]; then echo "TP=1 vs TP=2 rows skipped: $ngpu GPU(s) here, they need 2"
                             return; fi
  gpu_tests 240 tests/executor
  run 240 python3 -m lab.bench.e2e --runs attention=triton_flash \
    attention=triton_flash,executor=multiproc,tensor_parallel_size=2
}

part_speculative() {
  local name spec
  for name in off ngram3 ngram5; do
    case $name in
      off) spec=(speculative=none) ;;
      ngram3) spec=(speculative=ngram speculative.num_speculative_tokens=3) ;;
      ngram5) spec=(speculative=ngram speculative.num_speculative_tokens=5) ;;
    esac
    run 150 python3 run.py model=bench_qwen3_06b attention=triton_flash "${spec[@]}" \
      workload.num_requests=64 workload.output_len=128 workload.num_prefix_groups=0 \
      'logger=[console,jsonl]' "hydra.run.dir=$OUT/speculative/$name"
  done
  run 200 python3 -m lab.bench.e2e --num-seqs 64 --max-len 512 --runs attention=triton_flash \
    attention=triton_flash,speculative=ngram
}

part_simprofile() {
  run 300 python3 -m lab.sim.profile model=bench_qwen3_06b attention=triton_flash device=cuda \
    enforce_eager=true logger=[jsonl] --max-batch 256 --max-context 2048 --max-kv-gb 40 \
    -o "$OUT/sim_profile_bench_qwen3_06b.json"
}

parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(cudagraph e2e tests quant compile kernels ubatch tp speculative
                                 simprofile)
for p in "${parts[@]}"; do
  declare -F "part_$p" > /dev/null || { echo "unknown part '$p'"; exit 2; }
  start=$(date +%s)
  "part_$p" > "$OUT/$p.txt" 2>&1
  echo "[part $p: $(( $(date +%s) - start )) s]" >> "$OUT/$p.txt"
done
# the logs are committed (experiments/results/gpu-<date>/): no path of this machine in them
sed -i -E -e "s|$PWD/||g" -e "s#/[^ \"':]*/(site|dist)-packages/#<site-packages>/#g" "$OUT"/*.txt
cat "$OUT/machine.txt"
for p in "${parts[@]}"; do echo "== $p"; tail -n 25 "$OUT/$p.txt"; done
