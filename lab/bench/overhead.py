"""Engine overhead per step with no model: schedule() + update_from_output() on a trace.

    python -m lab.bench.overhead                      # 1000 requests, 4 arrivals per step
    python -m lab.bench.overhead --requests 2000 --max-num-seqs 512
    python -m lab.bench.overhead --sim-running 10000  # engine steps/s, 10k requests decoding
    python -m lab.bench.overhead --peer-python PY --repeat 3   # PY: a venv's python with vLLM

With --peer-python, vLLM V1's own `Scheduler` runs the same trace without a model in that
python (benchmarks/vllm_sched_peer.py: same limits, prefix caching on, one token per scheduled
request whose prompt is complete), in turns with lab's for --repeat rounds; each round's
lab / vLLM ratio of the mean schedule+update time per step is printed, then their median.

The trace follows the vLLM comparison in the engine issue: prompts uniform in [32, 512], outputs
uniform in [16, 256], 4 arrivals per step, max_num_seqs 256, greedy, ignore_eos. The executor is
`SimExecutor` (no model, zero step time), so the time is the scheduler + KV-cache manager +
request bookkeeping. Both sides run as their engine cores do once started: the heap built so
far frozen out of the cyclic GC (lab's build_core: lab.engine.core.freeze_gc_heap; vLLM's
EngineCore: vllm.utils.gc_utils.freeze_gc_heap), then the trace; lab's rounds share one
process, so each unfreezes at its end.

`--sim-running N` measures whole engine steps (LLMEngine.step: schedule, simulated execute,
update, statistics) per second of wall time under `executor=sim` with N requests admitted and
decoding at once (max_num_seqs N, every prompt prefilled in one step, blocks for all): how
fast the simulator goes at the scale of a large serving study.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab.bench.peer import add_peer_argument, peer_script
from lab.cache.hashing import make_block_hasher
from lab.cache.manager import KVCacheManager
from lab.config.compose import compose_config
from lab.config.worker import WorkerConfig
from lab.core.request import Request
from lab.core.sampling_params import SamplingParams
from lab.engine.core import freeze_gc_heap, unfreeze_gc_heap
from lab.engine.llm_engine import LLMEngine, RequestSpec
from lab.executor.sim import SimExecutor
from lab.scheduler import FCFSQueue, RecomputePreemption, Scheduler, SchedulerConfig
from lab.sim.step_time.constant import ConstantStepTime


def make_trace(n: int, seed: int, vocab: int = 32000) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(3, vocab) for _ in range(rng.randint(32, 512))], rng.randint(16, 256))
            for _ in range(n)]


def bench_executor() -> SimExecutor:
    """A SimExecutor of tiny_llama's shape that takes no (virtual) time per step."""
    from lab.models.tiny import ensure_tiny_model

    config = WorkerConfig(model_path=ensure_tiny_model("tiny_llama"), attention=None, kernels=None)
    return SimExecutor(config, ConstantStepTime(0.0))


def run(args: argparse.Namespace) -> dict[str, float]:
    kv = KVCacheManager(args.num_blocks, args.block_size, args.max_model_len, enable_caching=True)
    sched = Scheduler(SchedulerConfig(args.max_num_seqs, args.max_num_batched_tokens,
                                      args.max_model_len), kv, FCFSQueue(), RecomputePreemption())
    executor = bench_executor()
    hasher = make_block_hasher(args.block_size)
    trace = make_trace(args.requests, args.seed)
    freeze_gc_heap()  # as build_core leaves an engine core
    try:
        times, batch = _drive(sched, executor, hasher, trace, args.arrivals_per_step)
    finally:
        unfreeze_gc_heap()
    return {"steps": len(times), "mean_batch": statistics.mean(batch),
            "mean_ms": 1e3 * statistics.mean(times), "p50_ms": 1e3 * statistics.median(times),
            "p99_ms": 1e3 * sorted(times)[int(0.99 * (len(times) - 1))],
            "total_s": sum(times)}


def _drive(sched: Scheduler, executor: SimExecutor, hasher, trace, arrivals_per_step: int):
    """The trace through the scheduler: seconds of schedule + update and the batch per step."""
    times, batch = [], []
    i = 0
    while i < len(trace) or sched.has_unfinished_requests():
        for prompt, out_len in trace[i: i + arrivals_per_step]:
            sp = SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True)
            sched.add_request(Request(str(i), prompt, sp, None, time.perf_counter(),
                                      block_hasher=hasher))
            i += 1
        t0 = time.perf_counter()
        out = sched.schedule()
        t1 = time.perf_counter()
        result = executor.execute_model(out)
        t2 = time.perf_counter()
        sched.update_from_output(out, result)
        t3 = time.perf_counter()
        times.append((t1 - t0) + (t3 - t2))
        batch.append(len(out.num_scheduled_tokens))
    return times, batch


def run_sim_running(n: int, steps: int, prompt_len: int = 32, seed: int = 0) -> dict[str, float]:
    """Engine steps/s under executor=sim with `n` requests decoding at once."""
    max_tokens = steps + 8  # every prompt is prefilled in the first step (budget below)
    per_req = -(-(prompt_len + max_tokens) // 16)
    cfg = compose_config([
        "executor=sim", "sim/step_time=constant", "logger=[]", "model=tiny_llama",
        f"max_num_seqs={n}", f"max_num_batched_tokens={n * prompt_len}",
        f"num_gpu_blocks={n * per_req + 1}", f"seed={seed}"])
    engine = LLMEngine(cfg)
    rng = random.Random(seed)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    engine.add_requests([RequestSpec([rng.randrange(3, 512) for _ in range(prompt_len)], params)
                         for _ in range(n)])
    while engine.scheduler.num_waiting or any(  # admit and prefill every request
            r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running):
        engine.step()
    if len(engine.scheduler.running) != n:
        raise RuntimeError(f"{len(engine.scheduler.running)} of {n} requests running")
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    wall = time.perf_counter() - t0
    return {"running": n, "steps": steps, "steps_per_s": steps / wall,
            "tokens_per_s": steps * n / wall, "ms_per_step": 1e3 * wall / steps}


def run_peer(python: str, args: argparse.Namespace) -> dict[str, float]:
    """vLLM's Scheduler on the same trace (benchmarks/vllm_sched_peer.py), in its own process."""
    from lab.models.tiny import ensure_tiny_model

    script = peer_script("vllm_sched_peer.py")
    with tempfile.TemporaryDirectory() as tmp:
        trace, out = Path(tmp) / "trace.json", Path(tmp) / "result.json"
        trace.write_text(json.dumps(make_trace(args.requests, args.seed)))
        cmd = [python, str(script), "--model", str(ensure_tiny_model("tiny_llama")),
               "--trace", str(trace), "--out", str(out),
               "--max-num-seqs", str(args.max_num_seqs),
               "--max-num-batched-tokens", str(args.max_num_batched_tokens),
               "--max-model-len", str(args.max_model_len), "--block-size", str(args.block_size),
               "--num-blocks", str(args.num_blocks),
               "--arrivals-per-step", str(args.arrivals_per_step)]
        subprocess.run(cmd, check=True, stdout=sys.stderr, stderr=subprocess.DEVNULL)
        return json.loads(out.read_text())


def describe(name: str, r: dict[str, float]) -> str:
    return (f"{name:<14}steps {r['steps']}  mean batch {r['mean_batch']:.1f}  schedule+update "
            f"per step: mean {r['mean_ms']:.2f} ms  p50 {r['p50_ms']:.2f} ms  "
            f"p99 {r['p99_ms']:.2f} ms  (total {r['total_s']:.2f} s)")


def compare(args: argparse.Namespace) -> None:
    """lab and the peer in turns, --repeat rounds; each round's ratio and the median."""
    ratios = []
    for k in range(args.repeat):
        lab, peer = run(args), run_peer(args.peer_python, args)
        ratios.append(lab["mean_ms"] / peer["mean_ms"])
        print(f"round {k + 1}")
        print("  " + describe("lab", lab))
        print("  " + describe(f"vllm {peer['version']}", peer))
        print(f"  lab / vllm (mean per step): {ratios[-1]:.2f}")
    print(f"median lab / vllm over {len(ratios)} rounds: {statistics.median(ratios):.2f} "
          f"({', '.join(f'{r:.2f}' for r in ratios)})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--arrivals-per-step", type=int, default=4)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=16384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sim-running", type=int, default=0, metavar="N",
                   help="engine steps/s with N requests decoding under executor=sim")
    p.add_argument("--sim-steps", type=int, default=50, help="steps timed with --sim-running")
    add_peer_argument(p, "vllm_sched_peer.py", "its Scheduler on the same trace")
    p.add_argument("--repeat", type=int, default=1, help="rounds of lab and peer, in turns")
    args = p.parse_args()
    if args.peer_python:
        compare(args)
        return
    if args.sim_running:
        r = run_sim_running(args.sim_running, args.sim_steps, seed=args.seed)
        print(f"executor=sim, {r['running']} requests decoding: {r['steps_per_s']:.2f} engine "
              f"steps/s ({r['ms_per_step']:.1f} ms per step, {r['tokens_per_s']:.0f} simulated "
              f"tokens/s of wall time) over {r['steps']} steps")
        return
    print(describe("lab", run(args)))


if __name__ == "__main__":
    main()
