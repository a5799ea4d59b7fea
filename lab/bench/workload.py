"""What the offline benches share (throughput, e2e, step_profile, ipc): a checkpoint, random
prompt ids, an LLM built for speed, and one timed generate.

    p = argparse.ArgumentParser(); add_workload_args(p); args = p.parse_args()
    path, prompts = load_workload(args)            # the preset's checkpoint, seeded prompt ids
    llm = bench_llm(str(path), args.dtype, max_num_seqs=256, max_num_batched_tokens=8192)
    seconds, outs = timed_generate(llm, prompts, params, warmup=SamplingParams(max_tokens=4))
    llm.engine.shutdown(); del llm; free_memory()   # before the next engine sizes its KV cache
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

import torch

from lab import LLM, SamplingParams
from lab.frontend.outputs import RequestOutput
from lab.models.tiny import ensure_tiny_model, preset_names

#: the CPU KV cache (GiB) a bench engine gets by default: every request fits, so a bench measures
#: speed, not preemption
CPU_KV_CACHE_GB = 1.0


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """The checkpoint and the offline batch: --model, --num-prompts, --input-len, --output-len,
    --mixed (--min-len, --max-len), --dtype, --seed."""
    p.add_argument("--model", default="bench_llama",
                   help=f"preset ({', '.join(preset_names())}) or checkpoint directory")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--mixed", action="store_true", help="prompt lengths uniform in [min, max]")
    p.add_argument("--min-len", type=int, default=64)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--seed", type=int, default=0)


def checkpoint(model: str) -> Path:
    """The checkpoint directory of a preset name (generated once, cached) or a directory."""
    return Path(model) if Path(model).is_dir() else ensure_tiny_model(model)


def vocab_size(path: Path) -> int:
    """The vocabulary size in a checkpoint's config.json (prompt ids are drawn below it)."""
    return json.loads((path / "config.json").read_text())["vocab_size"]


def load_workload(args: argparse.Namespace) -> tuple[Path, list[list[int]]]:
    """(the checkpoint directory, the prompts) of add_workload_args' options."""
    path = checkpoint(args.model)
    return path, make_prompts(args, vocab_size(path))


def make_prompts(args: argparse.Namespace, vocab: int) -> list[list[int]]:
    """--num-prompts prompts of random ids in [3, vocab - 1) (below 3: the tiny tokenizers'
    special tokens), --input-len long or, with --mixed, uniform in [--min-len, --max-len];
    seeded by --seed."""
    g = torch.Generator().manual_seed(args.seed)
    lens = (torch.randint(args.min_len, args.max_len + 1, (args.num_prompts,), generator=g)
            if args.mixed else torch.full((args.num_prompts,), args.input_len))
    return [torch.randint(3, vocab - 1, (int(n),), generator=g).tolist() for n in lens]


def bench_llm(model: str, dtype: str, max_num_seqs: int, max_num_batched_tokens: int,
              **knobs) -> LLM:
    """An LLM for a bench: these limits, a CPU KV cache every request fits in
    (CPU_KV_CACHE_GB unless `knobs` says cpu_kv_cache_gb), then any other engine knobs."""
    return LLM(model, dtype=dtype, max_num_seqs=max_num_seqs,
               max_num_batched_tokens=max_num_batched_tokens,
               **{"cpu_kv_cache_gb": CPU_KV_CACHE_GB, **knobs})


def timed_generate(llm: LLM, prompts: list[list[int]],
                   params: SamplingParams | list[SamplingParams],
                   warmup: SamplingParams) -> tuple[float, list[RequestOutput]]:
    """One untimed generate of the first prompt under `warmup` (kernel compiles, first-call
    costs), then (wall seconds, outputs) of one generate of every prompt; on CUDA both ends wait
    for the device."""
    llm.generate(prompts[:1], warmup)
    _synchronize()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    _synchronize()
    return time.perf_counter() - t0, outs


def output_ids(outs: list[RequestOutput]) -> list[list[int]]:
    """The first completion's token ids of each request."""
    return [list(o.outputs[0].token_ids) for o in outs]


def free_memory() -> None:
    """Collect what engines no longer referenced hold (their cycles included) and hand the
    freed CUDA memory back, so that the next engine's KV-cache sizing sees it free."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
