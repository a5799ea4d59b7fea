"""vLLM peer for `lab.bench.overhead`: vLLM V1's own `Scheduler` driven without a model on the
same trace, timing schedule() + update_from_output() per step.

Standalone: it must not import `lab`; it runs under the python of a venv that has vLLM (CPU
build) installed (experiments/peer_setup.md):

    $LAB_VLLM_PYTHON benchmarks/vllm_sched_peer.py --model DIR --trace TRACE.json \
        --out RESULT.json [--max-num-seqs 256] [--max-num-batched-tokens 8192] \
        [--max-model-len 1024] [--block-size 16] [--num-blocks 16384] [--arrivals-per-step 4]

TRACE.json is a JSON list of [prompt token ids, output length]. Every request is greedy with
ignore_eos and max_tokens = its output length; prefix caching is on (sha256 block hashes, vLLM's
default); the "model" samples token 7 for every scheduled request whose prompt is complete
(tokens do not matter to the scheduler). RESULT.json: {"peer", "version", "steps",
"mean_batch", "mean_ms", "p50_ms", "p99_ms", "total_s"} as lab's bench prints them. The
model directory only gives vLLM's ModelConfig its architecture (a Hugging Face checkpoint).
Before the trace the heap is frozen out of the cyclic GC, as vLLM's EngineCore does once it has
started (its own `freeze_gc_heap`), and as lab's bench does for lab.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True, help="Hugging Face checkpoint directory")
    p.add_argument("--trace", required=True, help="JSON list of [prompt ids, output length]")
    p.add_argument("--out", required=True)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=16384)
    p.add_argument("--arrivals-per-step", type=int, default=4)
    return p.parse_args(argv)


def make_scheduler(args):
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    sched_cfg = SchedulerConfig(
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len, enable_chunked_prefill=True, is_encoder_decoder=False)
    model_cfg = ModelConfig(model=args.model, dtype="float32", seed=0,
                            max_model_len=args.max_model_len, skip_tokenizer_init=True)
    cache_cfg = CacheConfig(block_size=args.block_size, enable_prefix_caching=True)
    cache_cfg.num_gpu_blocks = args.num_blocks
    vllm_cfg = VllmConfig(scheduler_config=sched_cfg, model_config=model_cfg,
                          cache_config=cache_cfg)
    kv_cfg = KVCacheConfig(num_blocks=args.num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=args.block_size,
                                                      num_kv_heads=1, head_size=1,
                                                      dtype=torch.float32))])
    return Scheduler(vllm_config=vllm_cfg, kv_cache_config=kv_cfg,
                     structured_output_manager=StructuredOutputManager(vllm_cfg),
                     block_size=args.block_size, log_stats=True)


def run(args) -> dict:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    try:
        from vllm.utils.gc_utils import freeze_gc_heap
    except ImportError:  # a vLLM without it (before 0.11): what it does
        def freeze_gc_heap():
            gc.collect()
            gc.freeze()

    with open(args.trace) as f:
        trace = json.load(f)
    sched = make_scheduler(args)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(args.block_size, sha256)
    freeze_gc_heap()  # as vLLM's EngineCore does once started
    times, batch = [], []
    i = 0
    while i < len(trace) or sched.has_unfinished_requests():
        for prompt, out_len in trace[i: i + args.arrivals_per_step]:
            sp = SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True)
            sched.add_request(Request(str(i), prompt, sp, None, arrival_time=time.time(),
                                      block_hasher=hasher))
            i += 1
        t0 = time.perf_counter()
        out = sched.schedule()
        t1 = time.perf_counter()
        result = fake_model_output(sched, out, ModelRunnerOutput)
        t2 = time.perf_counter()
        sched.update_from_output(out, result)
        t3 = time.perf_counter()
        times.append((t1 - t0) + (t3 - t2))
        batch.append(len(out.num_scheduled_tokens))
    return {"steps": len(times), "mean_batch": statistics.mean(batch),
            "mean_ms": 1e3 * statistics.mean(times), "p50_ms": 1e3 * statistics.median(times),
            "p99_ms": 1e3 * sorted(times)[int(0.99 * (len(times) - 1))],
            "total_s": sum(times)}


def fake_model_output(sched, out, output_cls):
    """What a model runner returns: one token for every scheduled request whose prompt is
    complete after this step (a partial prefill samples nothing)."""
    req_ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in req_ids:
        req = sched.requests[rid]
        # the scheduler advanced num_computed_tokens when it scheduled the step
        done = req.num_computed_tokens >= req.num_prompt_tokens
        sampled.append([7] if done else [])
    return output_cls(req_ids=req_ids, req_id_to_index={r: k for k, r in enumerate(req_ids)},
                      sampled_token_ids=sampled)


def main(argv=None) -> None:
    args = parse_args(argv)
    import vllm

    result = {"peer": "vllm", "version": vllm.__version__, **run(args)}
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
