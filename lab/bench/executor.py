"""What an executor costs per step: the same decode workload under uniproc (TP=1, the worker in
the engine's process), multiproc TP=1 (one rank process: the SchedulerOutput crosses to it and
the ModelRunnerOutput back) and multiproc TP=2 (two ranks: that crossing to both, plus the
layers' all-reduces and the sampled ids' broadcast, for half the work per rank), at batch 1 and
64; then the crossing alone.

    python -m lab.bench.executor                         # tiny_qwen3, batch 1 and 64
    python -m lab.bench.executor --model bench_llama --batches 1 64 --output-len 64
    lab bench executor ...

Per step: the median `execute_time` (StepStats: the executor's execute_model, as the engine
core times it) over the decode steps that ran the whole batch, in microseconds; `vs uniproc`
is the difference from uniproc's median at that batch (what the executor adds, or saves by
splitting the model). Greedy, ignore_eos, one warm-up generate per engine.

Broadcast: real SchedulerOutputs of a decode step at each batch (captured from the uniproc
run), encoded as the executor encodes a step (multiproc.encode_call: pickled once), pushed over
ZMQ ipc:// to 1 and 2 reader processes that unpickle them and answer with a few bytes (as rank
0 answers a step), timed from the encode to the last answer; the median of --reps in
microseconds.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import tempfile
import time

import zmq

from lab import LLM, SamplingParams
from lab.distributed.launch import mp_context
from lab.executor.multiproc import encode_call
from lab.models.tiny import preset_names

SETTINGS = {  # name -> LLM keywords
    "uniproc TP=1": dict(executor="uniproc", tensor_parallel_size=1),
    "multiproc TP=1": dict(executor="multiproc", tensor_parallel_size=1),
    "multiproc TP=2": dict(executor="multiproc", tensor_parallel_size=2),
}


def decode_step_us(args, knobs: dict, batch: int, capture: list | None = None) -> float:
    """Median execute_time (us) of the full-batch decode steps of one engine under `knobs`;
    `capture` (a list) receives the SchedulerOutputs of those steps (uniproc only)."""
    llm = LLM(args.model, device="cpu", dtype=args.dtype, attention="torch", kernels="torch",
              max_num_seqs=batch, max_num_batched_tokens=max(2048, batch * args.input_len),
              **knobs)
    try:
        if capture is not None:
            _record_schedules(llm, capture, batch)
        params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
        prompts = [[(7 * i + j) % 500 + 3 for j in range(args.input_len)] for i in range(batch)]
        llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4))  # warm-up
        before = len(llm.engine.recent_steps)
        llm.generate(prompts, params)
        steps = list(llm.engine.recent_steps)[before:]
        decode = [s.execute_time for s in steps
                  if s.num_scheduled_tokens == batch and s.num_running_reqs == batch]
        return statistics.median(decode[1:] or decode) * 1e6
    finally:
        llm.engine.shutdown()


def _record_schedules(llm: LLM, capture: list, batch: int) -> None:
    executor = llm.engine.executor
    execute = executor.execute_model

    def recorded(sched):
        if sched.total_num_scheduled_tokens == batch and len(sched.num_scheduled_tokens) == batch:
            capture.append(sched)
        return execute(sched)

    executor.execute_model = recorded


def _reader(addr_in: str, addr_out: str) -> None:
    """A reader process: unpickle every message, answer b"ok"; stop on b"" ."""
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.connect(addr_in)
    push.connect(addr_out)
    while (message := pull.recv()) != b"":
        pickle.loads(message)
        push.send(b"ok")
    pull.close(linger=0)
    push.close(linger=0)
    ctx.term()


def broadcast_us(sched, readers: int, reps: int) -> tuple[float, int]:
    """Median us of encode + send to `readers` processes + their receive, decode and answer;
    the message's bytes."""
    ctx, procs = zmq.Context(), []
    with tempfile.TemporaryDirectory() as tmp:
        back = ctx.socket(zmq.PULL)
        back.bind(f"ipc://{tmp}/back")
        outs = []
        for r in range(readers):
            sock = ctx.socket(zmq.PUSH)
            sock.bind(f"ipc://{tmp}/in-{r}")
            outs.append(sock)
            procs.append(mp_context("forkserver").Process(
                target=_reader, args=(f"ipc://{tmp}/in-{r}", f"ipc://{tmp}/back"), daemon=True))
            procs[-1].start()
        times = []
        for _ in range(reps + 5):  # the first 5 connect the sockets
            t0 = time.perf_counter()
            payload = encode_call("execute_model", (sched,), None, False)
            for sock in outs:
                sock.send(payload)
            for _ in range(readers):
                back.recv()
            times.append(time.perf_counter() - t0)
        for sock in outs:
            sock.send(b"")
        for proc in procs:
            proc.join(timeout=5)
        for sock in [*outs, back]:
            sock.close(linger=0)
    ctx.term()
    return statistics.median(times[5:]) * 1e6, len(payload)


def run(args: argparse.Namespace) -> str:
    rows, scheds = [], {}
    for batch in args.batches:
        base = None
        for name, knobs in SETTINGS.items():
            capture = [] if name.startswith("uniproc") else None
            us = decode_step_us(args, knobs, batch, capture)
            if capture:
                scheds[batch] = capture[len(capture) // 2]
            base = us if base is None else base
            rows.append(f"{name:<16} {batch:>5} {us:>12.0f} {us - base:>+12.0f}")
    lines = [f"per decode step ({args.model}, {args.dtype}, input {args.input_len}, output "
             f"{args.output_len}): median execute_time",
             f"{'executor':<16} {'batch':>5} {'us/step':>12} {'vs uniproc':>12}", *rows, "",
             "SchedulerOutput broadcast (pickle + ZMQ push + unpickle + answer), median",
             f"{'batch':>5} {'readers':>7} {'bytes':>7} {'us':>8}"]
    for batch, sched in scheds.items():
        for readers in (1, 2):
            us, nbytes = broadcast_us(sched, readers, args.reps)
            lines.append(f"{batch:>5} {readers:>7} {nbytes:>7} {us:>8.0f}")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="tiny_qwen3", help=f"preset ({', '.join(preset_names())}) or dir")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    p.add_argument("--input-len", type=int, default=16)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--reps", type=int, default=200, help="broadcasts timed per row")
    return p.parse_args(argv)


def main(argv=None) -> None:
    print(run(parse_args(argv)))


if __name__ == "__main__":
    main()
