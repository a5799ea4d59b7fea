"""Dual batch overlap under tensor parallelism: micro-batch A's all-reduce runs while B computes.

Each micro-batch runs the whole model forward in a thread of its own; the two take turns, one
at a time (vLLM's UBatchContext scheme). A thread's turn ends at an all-reduce of the model's
TP group: it starts the collective without waiting for it, hands the turn over, and waits for
its collective only when the turn comes back. Turns run A0 B0 A1 B1 ... where k counts
all-reduces (two per decoder layer: after o_proj and after down_proj / the MoE sum):

    compute stream:  | A: embed..o_proj | B: embed..o_proj | A: norm..down_proj | B: ...
    comm stream:                        | A's all-reduce   | B's all-reduce     | A's ...

so every collective but the last runs under the other micro-batch's compute. A is ahead at
every layer: its attention writes the layer's KV before B's attention of the same layer runs,
which is what a request split across the two needs (lab/worker/ubatch.py). Every rank runs the
same turns, so the ranks issue their collectives in the same order.

How a collective runs while the other thread's turn goes on:
- CUDA: on a comm stream of our own that first waits for the compute stream; an event recorded
  after it is what the compute stream waits on when the turn comes back. (NCCL itself runs on
  its own internal stream synchronised with the comm stream: the compute stream never waits for
  a collective it does not need yet.)
- CPU (gloo): `async_op=True`, gloo's worker thread runs it; `wait()` when the turn comes back.
- one rank: nothing to run; the turns still alternate (what the CPU tests check).

The hook: for the length of `run`, every GroupCoordinator the model's modules hold as `.tp`
gets an instance attribute `all_reduce` that does the above for calls from the two micro-batch
threads (and calls the class's all_reduce for any other thread); leaving `run` removes it.
Nothing else in the model changes. (A permanent seam would be an optional hook object on
GroupCoordinator that all_reduce defers to; docs/ubatch.md.) The forward is eager Python:
a model wrapped in a CUDA graph or torch.compile'd across its collectives cannot take turns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist

from lab.attention.base import build_step_metadata
from lab.distributed.parallel_state import GroupCoordinator

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


class TakeTurns:
    """n threads that run one at a time, in turn 0, 1, ..., n-1, 0, ...; a finished thread
    leaves the rotation (the last one left runs on without waiting)."""

    def __init__(self, n: int) -> None:
        self._go = [threading.Event() for _ in range(n)]
        self._done = [False] * n

    def begin(self) -> None:
        """Give thread 0 the first turn (the caller, once every thread is started)."""
        self._go[0].set()

    def wait(self, i: int) -> None:
        """Block thread i until its turn."""
        self._go[i].wait()
        self._go[i].clear()

    def pass_turn(self, i: int) -> None:
        """Thread i hands the turn on and waits for it to come back (returns at once if no
        other thread is left)."""
        nxt = self._next(i)
        if nxt is not None:
            self._go[nxt].set()
            self.wait(i)

    def finish(self, i: int) -> None:
        """Thread i is done: the next one gets the turn."""
        self._done[i] = True
        nxt = self._next(i)
        if nxt is not None:
            self._go[nxt].set()

    def _next(self, i: int) -> int | None:
        n = len(self._go)
        return next((j % n for j in range(i + 1, i + n) if not self._done[j % n]), None)


class _AsyncWork:
    """A collective as a torch.distributed Work (gloo's worker thread, or no work at all for a
    group of one)."""

    def __init__(self, group: GroupCoordinator) -> None:
        self.group = group

    def start(self, x: torch.Tensor, op: str):
        if self.group.world_size == 1:
            return None
        return dist.all_reduce(x, op=_OPS[op], group=self.group.group, async_op=True)

    def finish(self, work) -> None:
        if work is not None:
            work.wait()


class _CommStream:
    """A collective on a CUDA comm stream; finish() makes the compute stream wait for it."""

    def __init__(self, group: GroupCoordinator, device: torch.device) -> None:
        self.group, self.device = group, device
        self.stream = torch.cuda.Stream(device)

    def start(self, x: torch.Tensor, op: str) -> torch.cuda.Event:
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            if self.group.world_size > 1:
                dist.all_reduce(x, op=_OPS[op], group=self.group.group)
            x.record_stream(self.stream)
            return self.stream.record_event()

    def finish(self, done: torch.cuda.Event) -> None:
        torch.cuda.current_stream(self.device).wait_event(done)


def model_groups(model: torch.nn.Module) -> list[GroupCoordinator]:
    """The distinct GroupCoordinators the model's modules hold as `.tp`."""
    found = {id(g): g for m in model.modules()
             if isinstance(g := getattr(m, "tp", None), GroupCoordinator)}
    return list(found.values())


@contextmanager
def hooked_all_reduce(groups: list[GroupCoordinator],
                      make: Callable[[GroupCoordinator], Callable]) -> Iterator[None]:
    """For the block: each group's all_reduce is make(group) (an instance attribute)."""
    for g in groups:
        g.all_reduce = make(g)
    try:
        yield
    finally:
        for g in groups:
            del g.all_reduce


class DualBatchOverlap:
    """Runs micro-batches as threads taking turns at every all-reduce (module docstring).

    `trace`, when a list, records the micro-batch index of each turn that ends at an
    all-reduce (tests read it)."""

    def __init__(self, device: torch.device | str, trace: list[int] | None = None) -> None:
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:  # the threads set it by index
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.trace = trace

    def _comm(self, group: GroupCoordinator):
        if self.device.type == "cuda":
            return _CommStream(group, self.device)
        return _AsyncWork(group)

    def run(self, model, attn_backend, ubatches: list, kv_caches: list[torch.Tensor]
            ) -> list[torch.Tensor]:
        """Each micro-batch's hidden states (in order). Metadata is built here, up front."""
        metadata = [build_step_metadata(attn_backend, u.attn_inputs) for u in ubatches]
        turns = TakeTurns(len(ubatches))
        index: dict[int, int] = {}  # thread id -> micro-batch
        results: list = [None] * len(ubatches)
        errors: list = [None] * len(ubatches)
        modes = (torch.is_inference_mode_enabled(), torch.is_grad_enabled())
        stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None

        def one(i: int) -> None:
            index[threading.get_ident()] = i
            try:
                turns.wait(i)
                with _thread_modes(self.device, stream, *modes):
                    u = ubatches[i]
                    results[i] = model(u.input_ids, u.positions, kv_caches, metadata[i])
            except BaseException as e:  # noqa: BLE001 - re-raised below, in the caller
                errors[i] = e
            finally:
                turns.finish(i)

        with hooked_all_reduce(model_groups(model), lambda g: self._hook(g, turns, index)):
            threads = [threading.Thread(target=one, args=(i,), name=f"lab-ubatch-{i}")
                       for i in range(len(ubatches))]
            for t in threads:
                t.start()
            turns.begin()
            for t in threads:
                t.join()
        for e in errors:
            if e is not None:
                raise e
        return results

    def _hook(self, group: GroupCoordinator, turns: TakeTurns, index: dict[int, int]):
        comm, plain = self._comm(group), type(group).all_reduce.__get__(group)

        def all_reduce(x: torch.Tensor, op: str = "sum") -> torch.Tensor:
            i = index.get(threading.get_ident())
            if i is None:
                return plain(x, op)
            handle = comm.start(x, op)
            if self.trace is not None:
                self.trace.append(i)
            turns.pass_turn(i)
            comm.finish(handle)
            return x

        return all_reduce


@contextmanager
def _thread_modes(device: torch.device, stream, inference: bool, grad: bool) -> Iterator[None]:
    """A micro-batch thread's torch state, as the caller's: inference / grad mode and, on CUDA,
    the device and its compute stream (all thread-local in torch)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    with torch.inference_mode(inference), torch.set_grad_enabled(grad), (
            torch.cuda.stream(stream) if stream is not None else nullcontext()):
        yield
