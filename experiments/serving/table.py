"""Side-by-side table of compare.sh's result JSONs (the median over rounds of each metric):
python table.py OUT_DIR RATE..."""

import json
import statistics
import sys
from pathlib import Path

KEYS = [("output_throughput", "out tok/s"), ("median_ttft_ms", "TTFT p50"),
        ("p99_ttft_ms", "TTFT p99"), ("median_tpot_ms", "TPOT p50"), ("p99_tpot_ms", "TPOT p99")]


def load(out: Path, engine: str, rate: str) -> list[dict]:
    """Every round's summary of one engine at one rate."""
    runs = []
    for path in sorted(out.glob(f"{engine}_rate{rate}_r*.json")):
        r = json.loads(path.read_text())
        runs.append(r.get("summary", r))
    return runs


def main() -> None:
    out, rates = Path(sys.argv[1]), sys.argv[2:]
    print("| rate | engine | rounds | ok | " + " | ".join(k[1] for k in KEYS) + " |")
    print("|---|---|---|---|" + "---|" * len(KEYS))
    for rate in rates:
        med = {}
        for engine in ("lab", "vllm"):
            runs = load(out, engine, rate)
            med[engine] = {k: statistics.median(r.get(k, float("nan")) for r in runs)
                           for k, _ in KEYS}
            ok = "/".join(str(r.get("completed", "?")) for r in runs)
            vals = " | ".join(f"{med[engine][k]:.1f}" for k, _ in KEYS)
            print(f"| {rate} | {engine} | {len(runs)} | {ok} | {vals} |")
        lab, vllm = med["lab"], med["vllm"]
        print(f"| {rate} | lab / vllm | | | {lab['output_throughput'] / vllm['output_throughput']:.2f}"
              f" | | | {lab['median_tpot_ms'] / vllm['median_tpot_ms']:.2f} | |")
    print("\n(medians over rounds; TTFT / TPOT in ms; 'lab / vllm': throughput ratio, TPOT p50 "
          "ratio)")


if __name__ == "__main__":
    main()
