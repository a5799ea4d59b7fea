"""Functions the executor tests run on every rank through collective_rpc (importable by name,
so a rank process can unpickle them)."""

from __future__ import annotations

import os

import torch


def rank_and_pid(worker) -> tuple[int, int]:
    return worker.rank, os.getpid()


def raise_on_rank_1_while_rank_0_waits(worker) -> None:
    """Rank 1 raises; rank 0 enters an all-reduce that rank 1 never joins."""
    if worker.rank == 1:
        raise ValueError("boom on rank 1")
    worker.state.tp.all_reduce(torch.ones(1))
