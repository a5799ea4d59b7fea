"""Parallel state: the process groups of one engine's workers, passed explicitly.

vLLM's layout of ranks (global rank = dp * PP * TP + pp * TP + tp):

    world  every worker of the engine
    tp     ranks that split each layer (consecutive global ranks): the groups used today
    pp     ranks that hold consecutive slices of the layers (size 1 here, present in the shape)
    dp     engine replicas that exchange only batch sizes (size 1 here, present in the shape)

A worker builds a `ParallelState` once (`init_parallel_state`) and hands its groups to what needs
them: the model gets `state.tp`, the worker its rank. Nothing is kept in module globals; the one
global is the default process group that torch.distributed itself keeps. A process that runs
alone (executor=uniproc, tensor_parallel_size=1) uses `single_process_state()`, whose groups
have one rank and whose collectives return their input: the layers are the same code either way.

Collectives run on the device's backend (NCCL on CUDA, gloo on CPU); Python objects travel
through a gloo group on the CPU (`broadcast_object`).
"""

from __future__ import annotations

import datetime
import pickle
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lab.distributed.config import ParallelConfig


class GroupCoordinator:
    """One group of ranks: its size, this process's rank in it, and its collectives.

    With one rank (or without torch.distributed) every collective returns its input."""

    def __init__(self, ranks: list[int], rank: int, group=None, cpu_group=None) -> None:
        self.ranks = list(ranks)
        self.rank = rank  # the global rank of this process
        self.rank_in_group = self.ranks.index(rank)
        self.world_size = len(self.ranks)
        self.group = group  # the device backend's group (None: a group of one)
        self.cpu_group = cpu_group  # gloo, for Python objects

    @classmethod
    def single(cls) -> GroupCoordinator:
        """A group of one process (no torch.distributed needed)."""
        return cls([0], 0)

    @property
    def is_first_rank(self) -> bool:
        return self.rank_in_group == 0

    @property
    def first_rank(self) -> int:
        """The global rank of the group's rank 0 (where logits are gathered and sampled)."""
        return self.ranks[0]

    # -- tensor collectives -------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """x reduced over the group (sum, or max / min), in place; returns x."""
        if self.world_size > 1:
            dist.all_reduce(x, op=_REDUCE_OPS[op], group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """The ranks' x concatenated along `dim` in rank order (every rank gets it)."""
        if self.world_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)

    def gather(self, x: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        """The ranks' x concatenated along `dim` on rank `dst` of the group; None elsewhere."""
        if self.world_size == 1:
            return x
        x = x.contiguous()
        is_dst = self.rank_in_group == dst
        parts = [torch.empty_like(x) for _ in range(self.world_size)] if is_dst else None
        dist.gather(x, parts, dst=self.ranks[dst], group=self.group)
        return torch.cat(parts, dim=dim) if is_dst else None

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Rank `src`'s x on every rank (in place; every rank passes a tensor of that shape)."""
        if self.world_size > 1:
            dist.broadcast(x, src=self.ranks[src], group=self.group)
        return x

    # -- Python objects -----------------------------------------------------------------------
    def broadcast_object(self, obj=None, src: int = 0):
        """Rank `src`'s picklable object on every rank (others pass anything, e.g. None)."""
        if self.world_size == 1:
            return obj
        if self.rank_in_group == src:
            payload = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=5)), dtype=torch.uint8)
            size = torch.tensor([payload.numel()], dtype=torch.int64)
        else:
            size = torch.zeros(1, dtype=torch.int64)
        dist.broadcast(size, src=self.ranks[src], group=self.cpu_group)
        if self.rank_in_group != src:
            payload = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.broadcast(payload, src=self.ranks[src], group=self.cpu_group)
        return obj if self.rank_in_group == src else pickle.loads(payload.numpy().tobytes())

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier(group=self.cpu_group)

    def __repr__(self) -> str:
        return f"GroupCoordinator(ranks={self.ranks}, rank_in_group={self.rank_in_group})"


_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


@dataclass
class ParallelState:
    """The groups of one worker process (see the module docstring)."""

    config: ParallelConfig
    world: GroupCoordinator
    tp: GroupCoordinator
    pp: GroupCoordinator
    dp: GroupCoordinator
    owns_process_group: bool = False  # True: destroy_parallel_state tears torch.distributed down

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def is_driver(self) -> bool:
        """The rank whose outputs the executor returns (global rank 0)."""
        return self.world.rank == 0


def single_process_state() -> ParallelState:
    """The state of a worker that runs alone: every group has one rank."""
    one = GroupCoordinator.single()
    return ParallelState(ParallelConfig(), one, one, one, one)


def group_ranks(config: ParallelConfig) -> dict[str, list[list[int]]]:
    """The rank lists of every group kind (vLLM's layout: TP innermost, then PP, then DP)."""
    tp, pp, dp = (config.tensor_parallel_size, config.pipeline_parallel_size,
                  config.data_parallel_size)
    ranks = torch.arange(config.world_size).reshape(dp, pp, tp)
    return {
        "world": [list(range(config.world_size))],
        "tp": ranks.reshape(-1, tp).tolist(),
        "pp": ranks.transpose(1, 2).reshape(-1, pp).tolist(),
        "dp": ranks.permute(1, 2, 0).reshape(-1, dp).tolist(),
    }


def init_parallel_state(
    config: ParallelConfig, rank: int, init_method: str, device: torch.device | str = "cpu",
    timeout_s: float = 600.0,
) -> ParallelState:
    """Join the engine's process group as global `rank` (every rank calls this with the same
    `init_method`, e.g. tcp://127.0.0.1:PORT) and build the groups. A world of one rank skips
    torch.distributed entirely."""
    if config.world_size == 1:
        return single_process_state()
    device = torch.device(device)
    backend = config.backend_for(device.type)
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend, init_method=init_method, rank=rank,
                            world_size=config.world_size, timeout=timeout)
    groups = {}
    for kind, lists in group_ranks(config).items():
        for ranks in lists:  # every rank creates every group, in the same order (torch's rule)
            group = dist.new_group(ranks, backend=backend, timeout=timeout)
            cpu_group = group if backend == "gloo" else dist.new_group(
                ranks, backend="gloo", timeout=timeout)
            if rank in ranks:
                groups[kind] = GroupCoordinator(ranks, rank, group, cpu_group)
    return ParallelState(config, groups["world"], groups["tp"], groups["pp"], groups["dp"],
                         owns_process_group=True)


def destroy_parallel_state(state: ParallelState) -> None:
    """Tear down torch.distributed if this state created it (idempotent)."""
    if state.owns_process_group and dist.is_initialized():
        dist.destroy_process_group()
    state.owns_process_group = False
