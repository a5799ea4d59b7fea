"""Where vLLM-CPU's time goes, op by op: torch.profiler around one offline batch of the peer.

Standalone (runs under the vLLM venv's python, must not import `lab`), the peer-side companion
of `python -m lab.bench.step_profile`:

    $LAB_VLLM_PYTHON benchmarks/vllm_op_profile.py --model DIR [--dtype bfloat16] \
        [--eager] [--num-prompts 16] [--input-len 128] [--output-len 128] [--rows 25]

DIR is a checkpoint lab generated (e.g. `.cache/models/bench_llama-<hash>`, the same one
`lab.bench.throughput` hands the peer). Same workload as the throughput benchmark (random
prompt ids, seed 0, greedy, ignore_eos); one warm-up generate, one timed generate (printed as
tok/s), then one profiled generate whose ops are printed by self CPU time. Read per step:
a row's total / the steps (one per output token here). The table names vLLM's C++ kernels
(`_C::cpu_attention_with_kv_cache`, `_C::onednn_mm`, `_C::weight_packed_linear`, ...).
"""

from __future__ import annotations

import argparse
import os
import random
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--eager", action="store_true", help="enforce_eager=True (default: compiled)")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--rows", type=int, default=25)
    args = p.parse_args(argv)

    from torch.profiler import ProfilerActivity, profile
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=args.model, dtype=args.dtype, seed=0, enforce_eager=args.eager,
              max_num_seqs=256, max_model_len=args.input_len + args.output_len + 16)
    vocab = llm.llm_engine.model_config.get_vocab_size()
    rng = random.Random(0)
    prompts = [TokensPrompt(prompt_token_ids=[rng.randint(3, vocab - 1)
                                              for _ in range(args.input_len)])
               for _ in range(args.num_prompts)]
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(max_tokens=4), use_tqdm=False)
    t0 = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    tokens = args.num_prompts * args.output_len
    print(f"vllm {args.dtype} {'eager' if args.eager else 'compiled'}: "
          f"{tokens / (time.perf_counter() - t0):.1f} tok/s, {args.output_len} steps")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        llm.generate(prompts, params, use_tqdm=False)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
