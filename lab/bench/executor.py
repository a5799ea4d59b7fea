"""What an executor costs per step: the same decode workload under uniproc (TP=1, the worker in
the engine's process), multiproc TP=1 (one rank process: the SchedulerOutput crosses to it and
the ModelRunnerOutput back) and multiproc TP=2 (two ranks: that crossing to both, plus the
layers' all-reduces and the sampled ids' broadcast, for half the work per rank), at batch 1 and
64; then the crossing alone.

    python -m lab.bench.executor                         # tiny_qwen3, batch 1 and 64
    python -m lab.bench.executor --repeat 3 --peer-python PY   # PY: a venv's python with vLLM
    python -m lab.bench.executor --model bench_llama --batches 1 64 --output-len 64
    lab bench executor ...

Per step: the median `execute_time` (StepStats: the executor's execute_model, as the engine
core times it) over the decode steps that ran the whole batch, in microseconds; `vs uniproc`
is the difference from uniproc's median at that batch (what the executor adds, or saves by
splitting the model). Greedy, ignore_eos, one warm-up generate per engine. The settings take
turns --repeat times and each keeps its fastest median (on a small shared machine noise only
adds time).

Broadcast: real SchedulerOutputs of a decode step at each batch (captured from the uniproc
run), encoded as the executor encodes a step (multiproc.encode_call: pickled once), pushed over
ZMQ ipc:// to 1 and 2 reader processes that unpickle them and answer with the time they were
done (as rank 0 answers a step); medians of --reps in microseconds: `send` (the writer's
encode + pushes), `one-way` (encode until the last reader has the object: what a step waits
before its ranks can start) and `rtt` (until the writer has every answer).

Anchor (--peer-python, a venv with vLLM's CPU build): vLLM's multiprocess executor broadcasts
through a shared-memory ring (MessageQueue); benchmarks/vllm_mq_peer.py times it on the same
terms, and both move a pickled bytes payload of each SchedulerOutput's size, so the transports
compare on equal bytes (the objects themselves differ between the projects).

Collectives: the median us of one all-reduce between the two ranks of a RankPool (gloo on the
CPU), at 256 B, 16 KB and 1 MB: what each of a TP=2 step's collectives costs at least.
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import zmq

from lab import LLM, SamplingParams
from lab.bench.peer import add_peer_argument, peer_script
from lab.distributed.launch import RankPool, mp_context
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
    """A reader process: unpickle every message, answer the time it was done (perf_counter:
    CLOCK_MONOTONIC, one clock for every process of the machine); stop on b"" ."""
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.connect(addr_in)
    push.connect(addr_out)
    while (message := pull.recv()) != b"":
        pickle.loads(message)
        push.send(struct.pack("d", time.perf_counter()))
    pull.close(linger=0)
    push.close(linger=0)
    ctx.term()


@dataclass
class Crossing:
    """Median microseconds of one broadcast (see the module docstring) and its bytes."""

    send_us: float
    one_way_us: float
    rtt_us: float
    nbytes: int


def broadcast_us(encode, readers: int, reps: int) -> Crossing:
    """`encode()` (the bytes of one message) pushed to `readers` processes that unpickle it and
    answer: the medians of send, one-way and round trip over `reps` messages."""
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
        sends, one_way, rtt = [], [], []
        for _ in range(reps + 5):  # the first 5 connect the sockets
            t0 = time.perf_counter()
            payload = encode()
            for sock in outs:
                sock.send(payload)
            t1 = time.perf_counter()
            done = [struct.unpack("d", back.recv())[0] for _ in range(readers)]
            rtt.append(time.perf_counter() - t0)
            sends.append(t1 - t0)
            one_way.append(max(done) - t0)
        for sock in outs:
            sock.send(b"")
        for proc in procs:
            proc.join(timeout=5)
        for sock in [*outs, back]:
            sock.close(linger=0)
    ctx.term()
    med = [statistics.median(xs[5:]) * 1e6 for xs in (sends, one_way, rtt)]
    return Crossing(*med, len(payload))


def run_peer(python: str, sizes: list[int], reps: int) -> dict[tuple[int, int], dict]:
    """vLLM's MessageQueue on `sizes`-byte payloads to 1 and 2 readers (vllm_mq_peer.py under
    the peer's python, from a directory outside the repository): rows by (bytes, readers)."""
    script = peer_script("vllm_mq_peer.py")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "mq.json"
        subprocess.run([python, str(script), "--kinds", "bytes", "--readers", "1,2",
                        "--sizes", ",".join(map(str, sizes)), "--n", str(reps), "--warmup", "50",
                        "--json", str(out)], cwd=tmp, check=True, capture_output=True)
        result = json.loads(out.read_text())
    return {(row["target"], row["readers"]): row | {"version": result["version"]}
            for row in result["rows"]}


def run(args: argparse.Namespace) -> str:
    best: dict[tuple[str, int], float] = {}
    scheds = {}
    for _ in range(args.repeat):
        for batch in args.batches:
            for name, knobs in SETTINGS.items():
                capture = [] if name.startswith("uniproc") and batch not in scheds else None
                us = decode_step_us(args, knobs, batch, capture)
                if capture:
                    scheds[batch] = capture[len(capture) // 2]
                best[name, batch] = min(us, best.get((name, batch), us))
    rows = []
    for batch in args.batches:
        base = best["uniproc TP=1", batch]
        rows += [f"{name:<16} {batch:>5} {best[name, batch]:>12.0f} "
                 f"{best[name, batch] - base:>+12.0f}" for name in SETTINGS]
    lines = [f"per decode step ({args.model}, {args.dtype}, input {args.input_len}, output "
             f"{args.output_len}): median execute_time, fastest of {args.repeat}",
             f"{'executor':<16} {'batch':>5} {'us/step':>12} {'vs uniproc':>12}", *rows, ""]
    lines += broadcast_table(scheds, args)
    lines += ["", "one all-reduce (sum, fp32) between the 2 ranks of a RankPool, median us",
              f"{'bytes':>9} {'us':>8}"]
    with RankPool(2) as pool:
        for numel in (64, 4096, 262144):
            us = pool.run(allreduce_us, numel, args.reps)[0]
            lines.append(f"{numel * 4:>9} {us:>8.0f}")
    return "\n".join(lines)


def allreduce_us(state, numel: int, reps: int) -> float:
    """On each rank of a RankPool: the median us of `reps` all-reduces of `numel` floats over
    the TP group (after 20 untimed)."""
    import torch

    x = torch.ones(numel)
    times = []
    for i in range(reps + 20):
        t0 = time.perf_counter()
        state.tp.all_reduce(x)
        if i >= 20:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def broadcast_table(scheds: dict, args: argparse.Namespace) -> list[str]:
    """The SchedulerOutput broadcast rows, then (with a peer) lab's ZMQ against vLLM's
    MessageQueue on bytes payloads of the same sizes."""
    lines = ["SchedulerOutput broadcast (encode_call + ZMQ push + unpickle + answer), median us",
             f"{'batch':>5} {'readers':>7} {'bytes':>7} {'send':>8} {'one-way':>8} {'rtt':>8}"]
    sizes = {}
    for batch, sched in scheds.items():
        for readers in (1, 2):
            c = broadcast_us(lambda s=sched: encode_call("execute_model", (s,), None, False),
                             readers, args.reps)
            sizes[batch] = c.nbytes
            lines.append(f"{batch:>5} {readers:>7} {c.nbytes:>7} {c.send_us:>8.0f} "
                         f"{c.one_way_us:>8.0f} {c.rtt_us:>8.0f}")
    if not args.peer_python:
        return lines
    peer = run_peer(args.peer_python, sorted(set(sizes.values())), args.reps)
    version = next(iter(peer.values()))["version"]
    lines += ["", f"transport of a pickled bytes payload: lab ZMQ vs vLLM {version} MessageQueue "
              "(shared memory), median us",
              f"{'bytes':>7} {'readers':>7} {'lab 1-way':>10} {'vLLM 1-way':>10} {'lab rtt':>8} "
              f"{'vLLM rtt':>8} {'rtt ratio':>9}"]
    for nbytes in sorted(set(sizes.values())):
        for readers in (1, 2):
            ours = broadcast_us(lambda n=nbytes: pickle.dumps(b"x" * n, protocol=5),
                                readers, args.reps)
            theirs = peer[(nbytes, readers)]
            lines.append(f"{nbytes:>7} {readers:>7} {ours.one_way_us:>10.0f} "
                         f"{theirs['one_way']:>10.0f} {ours.rtt_us:>8.0f} {theirs['rtt']:>8.0f} "
                         f"{ours.rtt_us / theirs['rtt']:>9.2f}")
    return lines


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="tiny_qwen3", help=f"preset ({', '.join(preset_names())}) or dir")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    p.add_argument("--input-len", type=int, default=16)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--reps", type=int, default=200, help="broadcasts timed per row")
    p.add_argument("--repeat", type=int, default=1, help="turns of the per-step settings")
    add_peer_argument(p, "vllm_mq_peer.py", "its MessageQueue as the broadcast anchor")
    return p.parse_args(argv)


def main(argv=None) -> None:
    print(run(parse_args(argv)))


if __name__ == "__main__":
    main()
