"""Where a step's time goes: lab's engine on an offline batch, each part of the step timed.

    python -m lab.bench.step_profile                          # bench_llama, 16 x 128 -> 128
    python -m lab.bench.step_profile --model bench_qwen3_06b --dtype bfloat16
    python -m lab.bench.step_profile --compile                # compile=true
    python -m lab.bench.step_profile --ops 20                 # + torch.profiler's top 20 ops

Every part is timed around the call that does it (wall time, perf_counter), on the engine's
own objects, for every step of one `LLM.generate` after a warm-up:

    model          model.forward, less attention (embedding, norms, projections, MLP/MoE)
    attention      the attention backend's forward, every layer (KV write + attention)
    logits         model.compute_logits (the LM head) of the sampled rows
    sampling       the Sampler (logits processors, greedy / random sampling, logprobs)
    input prep     the rest of the model runner's step: request state, persistent batch,
                   inputs (ids, positions, slot mapping), attention metadata
    scheduling     Scheduler.schedule + Scheduler.update_from_output
    engine other   the rest of LLMEngine.step: core outputs, detokenizer, output processing,
                   statistics

A part is inclusive of what it calls, so the table subtracts: model = forward - attention,
input prep = execute_model - forward - logits - sampling. Eager runs also time every linear
layer's forward (`model` includes them): the GEMM row under the table is those plus the LM head,
and its tok/s is what the engine would reach if everything else took no time (the ceiling that
faster non-GEMM code cannot pass; compile=true fuses the linears into its graph, no row). CPU only: on CUDA the calls return
before the device finishes, so the parts would not add up (a CUDA profile is torch.profiler's
job). The engine runs inproc (engine_client=inproc), so every part is in this process.
"""

from __future__ import annotations

import argparse
import os

import torch

from lab import LLM, SamplingParams
from lab.bench.workload import add_workload_args, bench_llm, load_workload
from lab.layers.linear import Linear
from lab.metrics.timers import Timers


def instrument(llm: LLM) -> Timers:
    """Patch the timed calls on this engine's objects (uniproc executor, inproc core)."""
    engine = llm.engine
    runner = engine.core.executor.worker.runner
    timers = Timers()
    timers.wrap(engine, "step", "step")
    timers.wrap(engine.core.scheduler, "schedule", "schedule")
    timers.wrap(engine.core.scheduler, "update_from_output", "update")
    timers.wrap(runner, "execute_model", "execute_model")
    timers.wrap(runner.model, "forward", "forward")
    timers.wrap(runner.model, "compute_logits", "logits")
    timers.wrap(runner.sampler, "forward", "sampling")
    timers.wrap(runner.attn_backend, "forward", "attention")
    if not engine.cfg.get("compile", False):
        for module in runner.model.modules():
            if isinstance(module, Linear):
                timers.wrap(module, "forward", "linears")
    return timers


def table(t: Timers) -> list[tuple[str, float]]:
    """(part, seconds) rows of the module docstring's table, and the total."""
    s = t.seconds
    rows = [
        ("model", s["forward"] - s["attention"]),
        ("attention", s["attention"]),
        ("logits", s["logits"]),
        ("sampling", s["sampling"]),
        ("input prep", s["execute_model"] - s["forward"] - s["logits"] - s["sampling"]),
        ("scheduling", s["schedule"] + s["update"]),
        ("engine other", s["step"] - s["execute_model"] - s["schedule"] - s["update"]),
    ]
    return [*rows, ("total", s["step"]), ("linears", s["linears"])]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_workload_args(p)
    p.add_argument("--attention", default=None, help="attention backend (default: the config's)")
    p.add_argument("--compile", action="store_true", help="compile=true")
    p.add_argument("--ops", type=int, default=0, metavar="N",
                   help="then profile one more generate with torch.profiler and print its N "
                        "costliest ops by self CPU time (the peer's: "
                        "benchmarks/vllm_op_profile.py)")
    return p.parse_args(argv)


def profile(args: argparse.Namespace) -> tuple[list[tuple[str, float]], int]:
    """(the table's rows in seconds, steps) of one timed generate after a warm-up."""
    path, prompts = load_workload(args)
    kwargs = {"compile": args.compile}  # eager unless --compile (the knob's null is auto)
    if args.attention:
        kwargs["attention"] = args.attention
    llm = bench_llm(str(path), args.dtype, max_num_seqs=256, max_num_batched_tokens=8192,
                    **kwargs)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4))  # warm-up
    timers = instrument(llm)
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(prompts, params)
    timers.close()
    if args.ops:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            llm.generate(prompts, params)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.ops))
    return table(timers), timers.calls["step"]


def main(argv=None) -> None:
    args = parse_args(argv)
    rows, steps = profile(args)
    *rows, (_, linears) = rows
    total = rows[-1][1]
    print(f"model {args.model}  dtype {args.dtype}  {args.num_prompts} prompts x "
          f"{args.input_len} -> {args.output_len}  steps {steps}  threads "
          f"{torch.get_num_threads()}  OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}"
          f"  compile={args.compile}")
    print(f"{'part':<14}{'ms/step':>10}{'share':>9}")
    for name, sec in rows:
        print(f"{name:<14}{1e3 * sec / steps:>10.3f}{100 * sec / total:>8.1f}%")
    tokens = args.num_prompts * args.output_len
    print(f"output tok/s {tokens / total:.1f}")
    if linears:
        gemm = linears + dict(rows)["logits"]
        print(f"GEMMs (linear layers {1e3 * linears / steps:.3f} + LM head "
              f"{1e3 * dict(rows)['logits'] / steps:.3f} ms/step): {100 * gemm / total:.1f}% of the "
              f"step; with nothing else: {tokens / gemm:.1f} tok/s")


if __name__ == "__main__":
    main()
