"""Process-boundary cost: the same offline workload through engine_client=inproc and =mp, side by
side in one run, and the microseconds per step that serialization and IPC take.

    python -m lab.bench.ipc                                   # tiny_qwen3, 64 x 32 -> 64
    python -m lab.bench.ipc --model bench_llama --input-len 128 --output-len 128 --repeat 3

Throughput: one LLM per setting (inproc and mp with the cpu_threads knob's default, torch's; mp
with cores - 1 torch threads, the default of an async_mp core, which leaves a core to the
server), all greedy with ignore_eos;
the settings take turns --repeat times and each keeps its fastest run (noise only adds time).
The ids of every mp run must equal inproc's.

Per step: the inproc run's own step results (EngineCoreOutputs, captured as the core returns
them) and requests are encoded with the codec the core process uses (msgspec msgpack), sent over
a ZMQ ipc:// PUSH/PULL pair and decoded, each message timed (median of --reps). A core process
does the encode and send on its output thread, while it steps, and the frontend the receive and
decode; the sum is what one step's results cost to cross, as an upper bound of what the step
loop waits for.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass

import torch
import zmq

from lab import LLM, SamplingParams
from lab.bench.workload import checkpoint, make_prompts
from lab.core.protocol import EngineCoreOutputs, EngineCoreRequest
from lab.engine.serial import MessageCodec
from lab.models.tiny import preset_names
from lab.platform import usable_cpu_cores


@dataclass
class Crossing:
    """Median microseconds of one message's encode, ZMQ send + receive, and decode; its bytes."""

    encode_us: float
    transport_us: float
    decode_us: float
    nbytes: int

    @property
    def total_us(self) -> float:
        return self.encode_us + self.transport_us + self.decode_us


def time_crossings(messages: list, message_type: type, reps: int) -> list[Crossing]:
    """Each message encoded, pushed through a ZMQ ipc:// socket pair, received and decoded,
    `reps` times; the median of each part per message."""
    codec = MessageCodec()
    ctx = zmq.Context()
    with tempfile.TemporaryDirectory() as tmp:
        addr = f"ipc://{tmp}/bench"
        pull = ctx.socket(zmq.PULL)
        pull.bind(addr)
        push = ctx.socket(zmq.PUSH)
        push.connect(addr)
        try:
            return [_time_one(m, message_type, codec, push, pull, reps) for m in messages]
        finally:
            push.close(linger=0)
            pull.close(linger=0)
            ctx.term()


def _time_one(message, message_type, codec, push, pull, reps) -> Crossing:
    enc, tra, dec = [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        data = codec.encode(message)
        t1 = time.perf_counter()
        push.send(data, copy=False)
        got = pull.recv(copy=False)
        t2 = time.perf_counter()
        decoded = codec.decode(got.buffer, message_type)
        t3 = time.perf_counter()
        if decoded != message:
            raise AssertionError(f"a {message_type.__name__} changed crossing the boundary")
        enc.append(t1 - t0)
        tra.append(t2 - t1)
        dec.append(t3 - t2)
    med = statistics.median
    return Crossing(med(enc) * 1e6, med(tra) * 1e6, med(dec) * 1e6, len(data))


def capture_steps(llm: LLM) -> list[tuple[EngineCoreOutputs, float]]:
    """From now on, record every (step result, seconds) of an inproc LLM's core."""
    core = llm.engine.core
    steps: list[tuple[EngineCoreOutputs, float]] = []
    step = core.step

    def timed_step() -> EngineCoreOutputs:
        t0 = time.perf_counter()
        result = step()
        steps.append((result, time.perf_counter() - t0))
        return result

    core.step = timed_step
    return steps


def capture_requests(llm: LLM) -> list[EngineCoreRequest]:
    """From now on, record every EngineCoreRequest an inproc LLM's core receives."""
    core = llm.engine.core
    requests: list[EngineCoreRequest] = []
    add = core.add_request

    def recorded_add(request: EngineCoreRequest) -> None:
        requests.append(request)
        add(request)

    core.add_request = recorded_add
    return requests


def cores_less_one() -> int:
    """The torch threads of the `mp cores - 1` engine: one core left to the frontend."""
    return max(1, usable_cpu_cores() - 1)


def settings() -> dict[str, tuple[str, int | None]]:
    """{name: (engine_client, cpu_threads)} of the timed engines."""
    return {"inproc": ("inproc", None), "mp": ("mp", None),
            "mp cores - 1": ("mp", cores_less_one())}


def run(args: argparse.Namespace) -> None:
    path = checkpoint(args.model)
    llms = {name: LLM(str(path), dtype="float32", engine_client=client, cpu_threads=threads,
                      max_num_seqs=args.num_prompts, cpu_kv_cache_gb=1.0)
            for name, (client, threads) in settings().items()}
    prompts = make_prompts(args, llms["inproc"].engine.hf_config.vocab_size)
    sp = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    best: dict[str, float] = {}
    ids: dict[str, list] = {}
    steps = requests = []
    try:
        for turn in range(args.repeat):
            for name, llm in llms.items():
                llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4))
                if name == "inproc" and turn == 0:
                    steps, requests = capture_steps(llm), capture_requests(llm)
                t0 = time.perf_counter()
                outs = llm.generate(prompts, sp)
                elapsed = time.perf_counter() - t0
                best[name] = min(elapsed, best.get(name, elapsed))
                ids[name] = [o.outputs[0].token_ids for o in outs]
                if name == "inproc" and turn == 0:
                    del llm.engine.core.step, llm.engine.core.add_request  # the class's
    finally:
        for llm in llms.values():
            llm.engine.shutdown()
    for name in llms:
        assert ids[name] == ids["inproc"], f"{name}: token ids differ from inproc"
    print(report(args, best, steps, requests))


def report(args, best: dict[str, float], steps, requests) -> str:
    n_out = args.num_prompts * args.output_len
    inproc = best["inproc"]
    lines = [f"model {args.model}  prompts {args.num_prompts}  {args.input_len} -> "
             f"{args.output_len} tokens  torch threads {torch.get_num_threads()} (cores - 1: "
             f"{cores_less_one()})  fastest of {args.repeat}",
             f"{'engine_client':<16}{'seconds':>9}{'output tok/s':>14}{'vs inproc':>11}"
             f"{'us/step more':>14}"]
    for name, t in best.items():
        extra = (t - inproc) / len(steps) * 1e6
        lines.append(f"{name:<16}{t:>9.2f}{n_out / t:>14.1f}{inproc / t:>11.3f}{extra:>14.0f}")
    outs = time_crossings([s for s, _ in steps], EngineCoreOutputs, args.reps)
    reqs = time_crossings(requests, EngineCoreRequest, args.reps)
    step_us = statistics.mean(dt for _, dt in steps) * 1e6
    mean = statistics.mean
    per_step_req = sum(c.total_us for c in reqs) / len(steps)
    lines += ["", f"per step ({len(steps)} steps of the inproc run, mean step {step_us:.0f} us; "
                  f"median of {args.reps} per message)",
              f"{'message':<28}{'bytes':>8}{'encode us':>11}{'zmq us':>9}{'decode us':>11}"
              f"{'total us':>10}{'% of step':>11}"]
    for name, cs in (("step outputs (per step)", outs), ("request (per request)", reqs)):
        total = mean(c.total_us for c in cs)
        lines.append(f"{name:<28}{mean(c.nbytes for c in cs):>8.0f}"
                     f"{mean(c.encode_us for c in cs):>11.1f}"
                     f"{mean(c.transport_us for c in cs):>9.1f}"
                     f"{mean(c.decode_us for c in cs):>11.1f}{total:>10.1f}"
                     f"{total / step_us * 100:>10.2f}%")
    total = mean(c.total_us for c in outs) + per_step_req
    lines.append(f"{'all, per step':<28}{'':>8}{'':>11}{'':>9}{'':>11}{total:>10.1f}"
                 f"{total / step_us * 100:>10.2f}%")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="tiny_qwen3", help=f"preset ({', '.join(preset_names())}) or dir")
    p.add_argument("--num-prompts", type=int, default=64, help="also max_num_seqs: the batch")
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--mixed", action="store_true", help="prompt lengths uniform in [min, max]")
    p.add_argument("--min-len", type=int, default=16)
    p.add_argument("--max-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3, help="turns; each setting keeps its fastest")
    p.add_argument("--reps", type=int, default=20, help="timings per message (median)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    main()
