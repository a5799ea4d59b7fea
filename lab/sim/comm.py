"""The cost of tensor parallelism's collectives under `executor=sim`: one all-reduce model, and
the collectives of one step.

An all-reduce model gives the seconds of one all-reduce of `nbytes` over its `world_size` ranks:

    RingAllReduce      NCCL's ring: t = latency_s + 2(n-1) step_latency_s
                                        + 2(n-1)/n x nbytes / bus_bandwidth
                       (bus bandwidth as nccl-tests' doc/PERFORMANCE.md defines it: a ring moves
                       2(n-1)/n of the buffer through every rank's link); the device's constants
                       by default (lab/sim/device.py: `RingAllReduce.for_device`)
    MeasuredAllReduce  a table of measured (bytes, seconds), interpolated piecewise-linearly in
                       bytes; `measure_allreduce` times one on this machine (gloo between local
                       processes, or nccl), `to_dict` / `from_dict` store it in a JSON (the
                       `sim.allreduce` knob loads one; a step-time profile can carry one)

What a step communicates is lab's real TP (lab/layers/embedding.py, lab/layers/linear.py,
lab/layers/moe.py, lab/worker/model_runner.py), per step of T tokens and R requests:

    the vocab-parallel embedding    1 all-reduce of T x hidden activations
    each decoder layer              2: after o_proj (row-parallel) and after the MLP's down_proj
                                    (a MoE layer: routed + shared experts, reduced once)
    the vocab-parallel LM head      a gather of R rows of fp32 logits (the padded vocabulary) on
                                    rank 0: the bus traffic of an all-reduce of half the bytes
    the sampled ids                 a broadcast of R int64 (latency-bound: one all-reduce's cost)

`step_comm_seconds` adds these up; `SimTarget.comm_seconds(shape)` (lab/sim/step_time/base.py)
calls it and the executor adds it to every step-time model's prediction. Not modelled: comm
overlapping compute (ubatch overlap, lab/worker/ubatch_overlap.py), NVLS / tree algorithms,
more than one node.

    python -m lab.sim.comm -n 2 -o allreduce.json      # measure gloo here; sim.allreduce=that
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lab.core.step import StepShape
    from lab.sim.device import DeviceSpec
    from lab.sim.model_shape import ModelShape

LOGIT_BYTES = 4  # the LM head's logits are gathered in fp32 (ParallelLMHead.forward)
TOKEN_ID_BYTES = 8  # the sampled ids are broadcast as int64


class AllReduceModel(ABC):
    """The seconds of one all-reduce over `world_size` ranks."""

    world_size: int

    @abstractmethod
    def seconds(self, nbytes: float) -> float:
        """Seconds of one all-reduce of a buffer of `nbytes` (>= 0; 0 for one rank)."""

    def gather_seconds(self, nbytes: float) -> float:
        """Seconds of gathering `nbytes` in all (every rank's nbytes / n) on one rank: the
        root's link takes (n-1)/n x nbytes, what a ring all-reduce of nbytes / 2 moves through
        every link (2(n-1)/n x nbytes / 2), so that all-reduce's time."""
        return self.seconds(nbytes / 2)


@dataclass(frozen=True)
class RingAllReduce(AllReduceModel):
    """A ring all-reduce (module docstring)."""

    world_size: int
    bus_bandwidth: float  # bytes/s
    latency_s: float = 0.0  # per all-reduce
    step_latency_s: float = 0.0  # per ring step

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size={self.world_size} must be >= 1")
        if self.world_size > 1 and not self.bus_bandwidth > 0:
            raise ValueError(f"a ring all-reduce over {self.world_size} ranks needs a bus "
                             f"bandwidth > 0 (got {self.bus_bandwidth})")
        if self.latency_s < 0 or self.step_latency_s < 0:
            raise ValueError("all-reduce latencies must be >= 0")

    @classmethod
    def for_device(cls, device: DeviceSpec, world_size: int) -> RingAllReduce:
        """The device's interconnect (lab/sim/device.py) over `world_size` ranks; ValueError
        for a device without one when world_size > 1."""
        if world_size > 1 and not device.allreduce_bandwidth > 0:
            raise ValueError(f"sim.device={device.name} has no interconnect "
                             "(allreduce_bandwidth): tensor_parallel_size > 1 cannot be "
                             "simulated on it")
        return cls(world_size, device.allreduce_bandwidth, device.allreduce_latency_s,
                   device.allreduce_step_latency_s)

    @property
    def steps(self) -> int:
        """Ring steps of one all-reduce: n-1 of reduce-scatter, n-1 of all-gather."""
        return 2 * (self.world_size - 1)

    def seconds(self, nbytes: float) -> float:
        n = self.world_size
        if n == 1:
            return 0.0
        return (self.latency_s + self.steps * self.step_latency_s
                + 2 * (n - 1) / n * nbytes / self.bus_bandwidth)


class MeasuredAllReduce(AllReduceModel):
    """All-reduce times measured at a few sizes: piecewise-linear in bytes between them, the
    smallest size's time below the range, above it the line through the last two points (its
    slope clamped at >= 0: noise must not make a larger buffer cheaper)."""

    def __init__(self, table: Mapping[float, float] | Iterable[tuple[float, float]],
                 world_size: int, source: str = "") -> None:
        pairs = sorted((float(b), float(s)) for b, s in
                       (table.items() if isinstance(table, Mapping) else table))
        if not pairs:
            raise ValueError("an all-reduce table needs at least one (bytes, seconds) point")
        sizes = [b for b, _ in pairs]
        if len(set(sizes)) != len(sizes):
            raise ValueError(f"an all-reduce table has one time per size (sizes: {sizes})")
        if any(b < 0 or s < 0 or not math.isfinite(s) for b, s in pairs):
            raise ValueError(f"all-reduce table sizes and times must be >= 0: {pairs}")
        if world_size < 2:
            raise ValueError(f"a measured all-reduce table is of >= 2 ranks (got {world_size})")
        self.sizes, self.times = sizes, [s for _, s in pairs]
        self.world_size, self.source = int(world_size), source

    def seconds(self, nbytes: float) -> float:
        sizes, times = self.sizes, self.times
        if nbytes <= sizes[0] or len(sizes) == 1:
            return times[0] if nbytes <= sizes[0] else times[-1]
        i = bisect.bisect_left(sizes, nbytes)
        if i == len(sizes):  # above the range: extrapolate the last segment
            slope = max((times[-1] - times[-2]) / (sizes[-1] - sizes[-2]), 0.0)
            return times[-1] + slope * (nbytes - sizes[-1])
        b0, b1, t0, t1 = sizes[i - 1], sizes[i], times[i - 1], times[i]
        return t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0)

    @classmethod
    def from_timings(cls, timings: Sequence[AllReduceTiming], world_size: int,
                     source: str = "") -> MeasuredAllReduce:
        """The table of a measurement's medians."""
        return cls([(t.nbytes, t.median_s) for t in timings], world_size, source)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "lab.sim.comm.MeasuredAllReduce", "world_size": self.world_size,
                "bytes": list(self.sizes), "seconds": list(self.times), "source": self.source}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MeasuredAllReduce:
        if len(d["bytes"]) != len(d["seconds"]):
            raise ValueError("an all-reduce table's `bytes` and `seconds` differ in length")
        return cls(zip(d["bytes"], d["seconds"]), d["world_size"], d.get("source", ""))

    @classmethod
    def load(cls, path: str | Path) -> MeasuredAllReduce:
        """From a JSON file: the table itself (`to_dict`), or a document (a step-time profile)
        that holds one under the key "allreduce"."""
        d = json.loads(Path(path).read_text())
        return cls.from_dict(d.get("allreduce", d))

    def __repr__(self) -> str:
        return f"MeasuredAllReduce({len(self.sizes)} sizes, world_size={self.world_size})"


def step_comm_seconds(model: ModelShape, allreduce: AllReduceModel, activation_bytes: float,
                      shape: StepShape) -> float:
    """Seconds of one step's collectives (module docstring) for `model`, the shape of one rank
    (ModelShape.from_hf_config(cfg, tensor_parallel_size)); `activation_bytes`: the width of
    the hidden states the layers all-reduce (the model dtype's). 0 for one rank or an empty
    step."""
    if allreduce.world_size == 1 or shape.num_tokens == 0:
        return 0.0
    requests = shape.num_prefill_reqs + shape.num_decode_reqs
    hidden = shape.num_tokens * model.hidden_size * activation_bytes
    logits = requests * model.vocab_size * allreduce.world_size * LOGIT_BYTES
    return ((2 * model.num_layers + 1) * allreduce.seconds(hidden)
            + allreduce.gather_seconds(logits) + allreduce.seconds(requests * TOKEN_ID_BYTES))


# -- measuring --------------------------------------------------------------------------------
@dataclass(frozen=True)
class AllReduceTiming:
    """One size of a measurement: seconds of an all-reduce (each repeat: the slowest rank's)."""

    nbytes: int
    median_s: float
    p10_s: float
    p90_s: float
    repeats: int


BACKEND_DEVICES = {"gloo": "cpu", "nccl": "cuda"}


def measure_allreduce(world_size: int, sizes_bytes: Sequence[int], repeats: int = 20,
                      backend: str = "gloo", warmup: int = 5,
                      timeout_s: float = 120.0) -> list[AllReduceTiming]:
    """Time `dist.all_reduce` of fp32 tensors of each size (rounded to whole floats, 4 bytes
    at least) between `world_size` local processes (lab.distributed.launch.RankPool: a free
    port, gloo on the CPU or nccl on one GPU per rank). Each repeat starts after a barrier and
    counts the slowest rank's time; `warmup` untimed repeats per size first. The processes are
    stopped on return or failure (RuntimeError naming the rank; none answering in `timeout_s`
    seconds is one)."""
    from lab.distributed.launch import RankPool

    if backend not in BACKEND_DEVICES:
        raise ValueError(f"backend={backend!r}: use one of {', '.join(BACKEND_DEVICES)}")
    if world_size < 2 or repeats < 1 or warmup < 0:
        raise ValueError(f"world_size={world_size} (>= 2), repeats={repeats} (>= 1) and "
                         f"warmup={warmup} (>= 0)")
    numels = [max(1, round(b / 4)) for b in sizes_bytes]
    with RankPool(world_size, BACKEND_DEVICES[backend], timeout_s=timeout_s) as pool:
        per_rank = pool.run(_time_allreduces, numels, repeats, warmup, BACKEND_DEVICES[backend])
    import numpy as np

    out = []
    for i, numel in enumerate(numels):
        slowest = np.max([rank[i] for rank in per_rank], axis=0)
        p10, median, p90 = np.percentile(slowest, [10, 50, 90])
        out.append(AllReduceTiming(4 * numel, float(median), float(p10), float(p90), repeats))
    return out


def _time_allreduces(state, numels: list[int], repeats: int, warmup: int,
                     device_type: str) -> list[list[float]]:
    """On each rank of a RankPool: per size, the seconds of `repeats` all-reduces over the TP
    group (after `warmup` untimed), each after a barrier."""
    import torch

    cuda = device_type == "cuda"
    device = torch.device("cuda", state.tp.rank_in_group) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out = []
    for numel in numels:
        x = torch.ones(numel, dtype=torch.float32, device=device)
        times = []
        for i in range(warmup + repeats):
            sync()
            state.tp.barrier()
            t0 = time.perf_counter()
            state.tp.all_reduce(x)
            sync()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        out.append(times)
    return out


DEFAULT_SIZES = [2**k for k in range(4, 25, 2)]  # 16 B .. 16 MiB


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("-n", "--world-size", type=int, default=2)
    p.add_argument("--backend", choices=list(BACKEND_DEVICES), default="gloo")
    p.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES, help="bytes")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("-o", "--output", type=Path, help="write the table (sim.allreduce=PATH)")
    args = p.parse_args(argv)
    timings = measure_allreduce(args.world_size, args.sizes, args.repeats, args.backend)
    print(f"all-reduce over {args.world_size} ranks ({args.backend}), seconds")
    print(f"{'bytes':>10} {'p10':>10} {'median':>10} {'p90':>10}")
    for t in timings:
        print(f"{t.nbytes:>10} {t.p10_s:>10.3g} {t.median_s:>10.3g} {t.p90_s:>10.3g}")
    if args.output:
        import platform

        source = f"measure_allreduce {args.backend} on {platform.node() or 'this machine'}"
        table = MeasuredAllReduce.from_timings(timings, args.world_size, source)
        args.output.write_text(json.dumps(table.to_dict(), indent=2) + "\n")
        print(f"-> {args.output}")


if __name__ == "__main__":
    main()
