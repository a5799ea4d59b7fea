"""Micro-batching benchmark: one step's forward as one batch, as two micro-batches run one after
the other, and as two micro-batches taking turns at every all-reduce (dual batch overlap).

    python -m lab.bench.ubatch                       # TP=1 here (+ TP=2 on 2+ GPUs, or --tp 2)
    python -m lab.bench.ubatch --tp 2 --device cpu   # TP=2 over gloo on the CPU
    python -m lab.bench.ubatch --smoke               # tiny model, few tokens: the script itself

Each row: median ms of the model forward over `--iters` runs of the same step (`--reqs`
requests of `--tokens` / `--reqs` new tokens each, after `--context` cached tokens: prefill
chunks, or decodes when there are as many requests as tokens), and the
ratio to the single batch of the same TP size. Every mode's hidden states are checked against
the single batch's first. Modes are timed in rounds (single, split, overlap, single, ...); on
the CPU each rank runs one torch thread. What it measures and when the overlap pays:
docs/ubatch.md.

The step builders here (`assign_blocks`, `step_inputs`, `run_history`) are also what the
micro-batching tests use to make mixed prefill + decode steps without an engine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from lab.attention.base import AttentionInputs, build_step_metadata
from lab.worker.ubatch import run_sequential, split_batch
from lab.worker.ubatch_overlap import DualBatchOverlap


@dataclass
class Req:
    """One request of a hand-made step: its token ids, tokens already cached, tokens now."""

    tokens: list[int]
    computed: int
    query: int


@dataclass
class StepInputs:
    """A StepBatch's model inputs (what lab.worker.ubatch.run_model reads)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_inputs: AttentionInputs


def assign_blocks(reqs: list[Req], block_size: int) -> tuple[list[list[int]], int]:
    """Disjoint block ids for every request's computed + query tokens (block 0 is the null
    block; ids handed out in reverse so tables are not the identity) and the blocks needed."""
    counts = [-(-(r.computed + r.query) // block_size) for r in reqs]
    total = sum(counts) + 1
    ids = list(range(total - 1, 0, -1))
    tables, start = [], 0
    for c in counts:
        tables.append(ids[start : start + c])
        start += c
    return tables, total


def step_inputs(reqs: list[Req], tables: list[list[int]], block_size: int,
                device: torch.device | str = "cpu", max_model_len: int = 4096,
                pad_to: int | None = None) -> StepInputs:
    """The flat step of `reqs` (each computes tokens [computed, computed + query)); `pad_to`
    adds padding tokens (slot -1) up to that many."""
    qlens = np.array([r.query for r in reqs])
    computed = np.array([r.computed for r in reqs])
    positions = np.concatenate([np.arange(r.computed, r.computed + r.query) for r in reqs])
    ids = np.concatenate([r.tokens[r.computed : r.computed + r.query] for r in reqs])
    slots = np.concatenate([[t[p // block_size] * block_size + p % block_size for p in
                             range(r.computed, r.computed + r.query)] for r, t in zip(reqs, tables)])
    pad = (pad_to or len(ids)) - len(ids)
    width = max(len(t) for t in tables)
    table = np.array([t + [0] * (width - len(t)) for t in tables])
    seq = computed + qlens

    def dev(a, dtype):
        return torch.as_tensor(np.asarray(a), dtype=dtype, device=device)

    attn = AttentionInputs(
        query_start_loc=dev(np.concatenate([[0], np.cumsum(qlens)]), torch.int32),
        seq_lens=dev(seq, torch.int32), num_computed_tokens=dev(computed, torch.int32),
        block_table=dev(table, torch.int32),
        slot_mapping=dev(np.concatenate([slots, [-1] * pad]), torch.int64),
        num_reqs=len(reqs), num_actual_tokens=int(qlens.sum()), max_query_len=int(qlens.max()),
        max_seq_len=int(seq.max()), block_size=block_size, query_lens_cpu=qlens.tolist(),
        seq_lens_cpu=seq.tolist(), max_model_len=max_model_len)
    return StepInputs(dev(np.concatenate([ids, [0] * pad]), torch.int64),
                      dev(np.concatenate([positions, [0] * pad]), torch.int64), attn)


def run_history(model, backend, reqs: list[Req], tables, block_size: int, kv_caches,
                device: torch.device | str = "cpu") -> None:
    """Fill the cache with every request's computed tokens (one prefill step, single batch)."""
    done = [(Req(r.tokens, 0, r.computed), t) for r, t in zip(reqs, tables) if r.computed]
    if done:
        step = step_inputs([r for r, _ in done], [t for _, t in done], block_size, device)
        model(step.input_ids, step.positions, kv_caches, build_step_metadata(backend, step.attn_inputs))


def make_cache(model, backend, num_blocks: int, block_size: int, dtype, device):
    spec = backend.kv_cache_spec(model.attention_spec, block_size, dtype)
    return backend.allocate_kv_cache(spec, num_blocks, model.num_layers, torch.device(device)).layers


def forward_modes(model, backend, step: StepInputs, kv_caches, device, trace=None) -> dict:
    """Callables of the three modes on `step` (each returns the step's hidden states)."""
    ubatches = split_batch(step.input_ids, step.positions, step.attn_inputs)
    overlap = DualBatchOverlap(device, trace)
    return {
        "single": lambda: model(step.input_ids, step.positions, kv_caches,
                                build_step_metadata(backend, step.attn_inputs)),
        "split": lambda: torch.cat(run_sequential(model, backend, ubatches, kv_caches)),
        "overlap": lambda: torch.cat(overlap.run(model, backend, ubatches, kv_caches)),
    }


def prefill_step(vocab: int, num_reqs: int, tokens: int, context: int, seed: int = 0) -> list[Req]:
    """`num_reqs` prefill chunks of tokens / num_reqs each after `context` cached tokens."""
    rng = np.random.default_rng(seed)
    q = tokens // num_reqs
    return [Req(rng.integers(0, vocab, context + q).tolist(), context, q) for _ in range(num_reqs)]


def time_modes(state, path: str, attention: str, dtype: str, device: str, num_reqs: int,
               tokens: int, context: int, iters: int) -> dict:
    """On each rank: load the model (its TP part), build the step, check every mode against the
    single batch, and time each (median ms). Run by every rank of a RankPool, or directly with
    state=None for one rank."""
    from hydra.utils import get_class

    from lab.models.loader import DTYPES, load_model

    tp = state.tp if state is not None else None
    if device == "cpu":  # one thread per rank: OpenMP's spinning threads of two ranks on few
        torch.set_num_threads(1)  # cores would time the contention, not the modes
    if device == "cuda" and tp is not None:
        device = f"cuda:{tp.rank_in_group}"
        torch.cuda.set_device(device)
    backend = get_class(attention)()
    torch_dtype = DTYPES[dtype]
    model, hf = load_model(path, backend, torch_dtype, device, tp=tp)
    reqs, bs = prefill_step(hf.vocab_size, num_reqs, tokens, context), 16
    tables, nblocks = assign_blocks(reqs, bs)
    caches = make_cache(model, backend, nblocks, bs, torch_dtype, device)
    with torch.inference_mode():
        run_history(model, backend, reqs, tables, bs, caches, device)
        step = step_inputs(reqs, tables, bs, device)
        modes = forward_modes(model, backend, step, caches, device)
        ref = modes["single"]()
        out = {"max_abs_diff": {m: (f() - ref).abs().max().item() for m, f in modes.items()}}
        out["ms"] = median_ms(modes, iters, str(device).startswith("cuda"))
    return out


def median_ms(fns: dict, iters: int, cuda: bool) -> dict[str, float]:
    """Median ms of each callable, timed in rounds (one call of each per round, so a change
    of the machine's load during the run hits every mode alike)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(iters + 1):  # the first round warms up
        for name, fn in fns.items():
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize()
            times[name].append(1e3 * (time.perf_counter() - t0))
    return {name: statistics.median(t[1:]) for name, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=None, help="tiny preset (default: bench_qwen3_06b on "
                   "CUDA, bench_llama on the CPU, tiny_llama with --smoke)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tp", type=int, nargs="+", default=None,
                   help="TP sizes (default: 1, and 2 on a machine with 2+ GPUs)")
    p.add_argument("--tokens", type=int, default=None, help="tokens of the step")
    p.add_argument("--reqs", type=int, default=8)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    cuda = args.device.startswith("cuda")
    model = args.model or ("tiny_llama" if args.smoke else
                           "bench_qwen3_06b" if cuda else "bench_llama")
    tokens = args.tokens or (32 if args.smoke else 8192 if cuda else 1024)
    tps = args.tp or ([1, 2] if cuda and torch.cuda.device_count() >= 2 else [1])
    attention = ("lab.attention.triton_flash.TritonFlashBackend" if cuda
                 else "lab.attention.torch_backend.TorchAttentionBackend")
    dtype = "bfloat16" if cuda else "float32"
    context = 4 if args.smoke else args.context
    iters = 2 if args.smoke else args.iters
    from lab.models.tiny import ensure_tiny_model

    path = str(ensure_tiny_model(model))
    run = (attention, dtype, args.device, args.reqs, tokens, context, iters)
    print(f"model {model}  device {args.device}  {dtype}  {args.reqs} requests x "
          f"{tokens // args.reqs} new tokens after {context} cached  (median of {iters})")
    print(f"{'tp':>3} {'mode':<8}{'ms':>10}{'vs single':>11}{'max |diff|':>12}")
    for tp in tps:
        res = time_modes(None, path, *run) if tp == 1 else _time_tp(tp, path, run, cuda)
        for mode, ms in res["ms"].items():
            print(f"{tp:>3} {mode:<8}{ms:>10.2f}{ms / res['ms']['single']:>11.3f}"
                  f"{res['max_abs_diff'][mode]:>12.2e}")


def _time_tp(tp: int, path: str, run: tuple, cuda: bool) -> dict:
    from lab.distributed.launch import RankPool

    with RankPool(tp, device="cuda" if cuda else "cpu", timeout_s=600) as pool:
        return pool.run(time_modes, path, *run)[0]


if __name__ == "__main__":
    main()
