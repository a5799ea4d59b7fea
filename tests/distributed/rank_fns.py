"""Functions run on every rank of a RankPool (importable by name in the rank processes)."""

from __future__ import annotations

import torch


def collectives(state) -> dict:
    """Each collective of the TP group on rank-dependent tensors."""
    tp = state.tp
    r = tp.rank_in_group
    x = torch.arange(4, dtype=torch.float32) + 10 * r
    gathered = tp.gather(x.clone(), dst=0, dim=0)
    return {
        "rank": state.rank,
        "tp_size": tp.world_size,
        "sum": tp.all_reduce(x.clone()).tolist(),
        "max": tp.all_reduce(x.clone(), op="max").tolist(),
        "all_gather": tp.all_gather(x.clone().reshape(1, 4), dim=0).tolist(),
        "gather": None if gathered is None else gathered.tolist(),
        "broadcast": tp.broadcast(x.clone(), src=1).tolist(),
        "object": tp.broadcast_object({"from": r, "list": [1, "a"]} if r == 0 else None),
        "groups": (state.world.ranks, state.pp.ranks, state.dp.ranks),
    }


def fail_on_rank_1(state) -> int:
    if state.rank == 1:
        raise ValueError("rank 1 refuses")
    return state.rank


def exit_on_rank_1(state) -> int:
    import os

    if state.rank == 1:
        os._exit(3)
    return state.rank
