"""One decode step with CUDA graphs vs eager (CUDA only), at several batch sizes.

    python -m lab.bench.cudagraph                      # bench_qwen3_06b, triton_flash, 1/8/64
    python -m lab.bench.cudagraph --batches 1 8 64 256 --attention triton_mla --model tiny_deepseek

Two workers on the same GPU load the model: one with `enforce_eager=true`, one capturing the
decode graphs of exactly the batch sizes measured (`cudagraph_capture_sizes`). For each batch
size B, both prefill B prompts of --prompt-len tokens through their model runner, then run
--steps decode steps of all B requests (greedy); the table gives the median milliseconds of a
decode step (`execute_model`: input prep, forward, logits, sampling; every step ends reading
the sampled ids back, so it is synchronous), the speed-up, and whether both produced the same
token ids (bf16: a different kernel order may flip a near tie, so a mismatch is reported, not
fatal). Needs lab's dependencies and a CUDA device (`--device cpu` runs the same padded path
eagerly: a smoke test of the script, not a measurement of graphs).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lab.config.compose import compose_config
from lab.core.sampling_params import SamplingParams
from lab.core.step import CachedRequestData, NewRequestData, SchedulerOutput
from lab.engine.builder import worker_config
from lab.worker.worker import Worker


def make_worker(args, batches: list[int], eager: bool) -> Worker:
    sizes = ",".join(map(str, batches))
    cfg = compose_config([f"model={args.model}", f"attention={args.attention}",
                          f"device={args.device}",
                          f"block_size={args.block_size}", f"max_num_seqs={max(batches)}",
                          f"max_num_batched_tokens={max(batches) * args.prompt_len}",
                          f"enforce_eager={str(eager).lower()}",
                          f"cudagraph_capture_sizes=[{sizes}]"])
    worker = Worker(worker_config(cfg))
    worker.initialize_cache(num_blocks_for(args, max(batches)), args.max_model_len)
    return worker


def num_blocks_for(args, batch: int) -> int:
    per_req = -(-(args.prompt_len + args.steps + 2) // args.block_size)
    return batch * per_req + 1  # + the null block


def decode_steps(worker: Worker, args, batch: int, tag: str) -> tuple[list[float], list]:
    """Prefill `batch` prompts, then time args.steps decode steps; (ms per step, token ids)."""
    per_req = -(-(args.prompt_len + args.steps + 2) // args.block_size)
    g = torch.Generator().manual_seed(batch)
    p = SamplingParams(temperature=0, max_tokens=args.steps + 1)
    ids = [f"{tag}{batch}-{i}" for i in range(batch)]
    vocab = worker.hf_config.vocab_size
    news = [NewRequestData(rid, torch.randint(3, vocab, (args.prompt_len,), generator=g).tolist(),
                           p, (list(range(1 + i * per_req, 1 + (i + 1) * per_req)),), 0)
            for i, rid in enumerate(ids)]
    out = worker.execute_model(SchedulerOutput(
        scheduled_new_reqs=news, num_scheduled_tokens={r: args.prompt_len for r in ids},
        total_num_scheduled_tokens=batch * args.prompt_len))
    tokens, times = [list(out.sampled_token_ids[r]) for r in ids], []
    for k in range(args.steps):
        sched = SchedulerOutput(
            scheduled_cached_reqs=[CachedRequestData(r, ([],), args.prompt_len + k) for r in ids],
            num_scheduled_tokens={r: 1 for r in ids}, total_num_scheduled_tokens=batch)
        t0 = time.perf_counter()
        out = worker.execute_model(sched)
        times.append((time.perf_counter() - t0) * 1e3)
        for t, r in zip(tokens, ids):
            t.extend(out.sampled_token_ids[r])
    worker.execute_model(SchedulerOutput(finished_req_ids=set(ids)))
    return times[args.warmup:], tokens


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="bench_qwen3_06b")
    p.add_argument("--attention", default="triton_flash")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("lab.bench.cudagraph needs CUDA (or --device cpu for a smoke test)")
    eager, graphs = make_worker(args, args.batches, True), make_worker(args, args.batches, False)
    captured = sorted(graphs.runner.padded.graphs) if graphs.runner.padded else []
    rows = []
    for b in args.batches:
        t_eager, ids_eager = decode_steps(eager, args, b, "e")
        t_graph, ids_graph = decode_steps(graphs, args, b, "g")
        e, g = statistics.median(t_eager), statistics.median(t_graph)
        same = sum(x == y for x, y in zip(ids_eager, ids_graph))
        rows.append(f"{b:>6}{e:>12.3f}{g:>12.3f}{e / g:>10.2f}x  {same}/{b}")
    where = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (padded, eager)"
    print(f"\ndecode step, {args.model} attention={args.attention} {where}  "
          f"graphs captured: {captured}")
    print(f"{'batch':>6}{'eager ms':>12}{'graph ms':>12}{'speedup':>11}  same ids")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
