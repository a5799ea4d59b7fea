"""Token-id fingerprints of a few engine configurations, to show a refactor changed no output:
run it at two commits (a worktree each) and diff the output.

    python scripts/ids_fingerprint.py > after.json
    (cd ../old-worktree && PYTHONPATH=$PWD python scripts/ids_fingerprint.py) > before.json

Each configuration generates 8 prompts greedily and again with seeded sampling (temperature
0.8); the fingerprint is a hash of every token id, so equal fingerprints mean equal ids.
"""

from __future__ import annotations

import hashlib
import json

from lab import LLM, SamplingParams

PROMPTS = [[3 + (7 * i + j) % 500 for j in range(20 + 13 * i)] for i in range(8)]
PARAMS = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
          SamplingParams(temperature=0.8, seed=7, max_tokens=24, ignore_eos=True)]
CONFIGS = [
    dict(model="tiny_llama"),
    dict(model="tiny_qwen3", num_gpu_blocks=24, max_num_batched_tokens=32),  # chunked, preempts
    dict(model="tiny_deepseek", num_gpu_blocks=24),
    dict(model="tiny_llama", scheduler="priority", preemption="swap", num_gpu_blocks=20),
    dict(model="tiny_llama", attention="cpu"),
    dict(model="tiny_llama", dtype="bfloat16"),
    dict(model="tiny_llama", executor="sim"),
]


def fingerprint(config: dict) -> str:
    llm = LLM(**config)
    try:
        ids = [[o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp)] for sp in PARAMS]
    finally:
        llm.engine.shutdown()
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]


if __name__ == "__main__":
    print(json.dumps({json.dumps(c): fingerprint(c) for c in CONFIGS}, indent=1))
