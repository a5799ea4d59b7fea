"""Side-by-side table of compare.sh's result JSONs: python table.py OUT_DIR RATE..."""

import json
import sys
from pathlib import Path


def main() -> None:
    out, rates = Path(sys.argv[1]), sys.argv[2:]
    keys = [("output_throughput", "out tok/s"), ("median_ttft_ms", "TTFT p50"),
            ("p99_ttft_ms", "TTFT p99"), ("median_tpot_ms", "TPOT p50"), ("p99_tpot_ms", "TPOT p99")]
    print("| rate | engine | ok | " + " | ".join(k[1] for k in keys) + " |")
    print("|---|---|---|" + "---|" * len(keys))
    for rate in rates:
        rows = {}
        for engine in ("lab", "vllm"):
            r = json.loads((out / f"{engine}_rate{rate}.json").read_text())
            s = r.get("summary", r)
            rows[engine] = s
            vals = " | ".join(f"{s.get(k, float('nan')):.1f}" for k, _ in keys)
            print(f"| {rate} | {engine} | {s.get('completed', '?')} | {vals} |")
        lab, vllm = rows["lab"], rows["vllm"]
        print(f"| {rate} | lab / vllm | | {lab['output_throughput'] / vllm['output_throughput']:.2f}"
              f" | | | {lab['median_tpot_ms'] / vllm['median_tpot_ms']:.2f} | |")


if __name__ == "__main__":
    main()
