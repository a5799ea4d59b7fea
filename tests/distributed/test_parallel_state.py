"""Parallel state over two spawned gloo ranks: groups, collectives, failures, teardown."""

from __future__ import annotations

import pytest
import rank_fns

from lab.distributed.config import ParallelConfig
from lab.distributed.launch import RankPool
from lab.distributed.parallel_state import (
    GroupCoordinator,
    group_ranks,
    single_process_state,
)


def test_group_layout_follows_vllm():
    groups = group_ranks(ParallelConfig(tensor_parallel_size=4))
    assert groups["tp"] == [[0, 1, 2, 3]]
    assert groups["pp"] == [[0], [1], [2], [3]]
    assert groups["dp"] == [[0], [1], [2], [3]]
    assert groups["world"] == [[0, 1, 2, 3]]


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="tensor_parallel_size=0"):
        ParallelConfig(tensor_parallel_size=0)
    with pytest.raises(ValueError, match="pipeline_parallel_size=2"):
        ParallelConfig(pipeline_parallel_size=2)
    with pytest.raises(ValueError, match="backend='mpi'"):
        ParallelConfig(backend="mpi")


def test_single_process_collectives_are_identity():
    import torch

    state = single_process_state()
    x = torch.ones(3)
    assert state.tp.all_reduce(x) is x and state.tp.gather(x) is x
    assert state.tp.broadcast_object({"a": 1}) == {"a": 1}
    assert state.is_driver and GroupCoordinator.single().world_size == 1


def test_collectives_over_two_gloo_ranks():
    with RankPool(2) as pool:
        r0, r1 = pool.run(rank_fns.collectives)
        assert [r0["rank"], r1["rank"]] == [0, 1] and r0["tp_size"] == 2
        for r in (r0, r1):
            assert r["sum"] == [10.0, 12.0, 14.0, 16.0]
            assert r["max"] == [10.0, 11.0, 12.0, 13.0]
            assert r["all_gather"] == [[0.0, 1.0, 2.0, 3.0], [10.0, 11.0, 12.0, 13.0]]
            assert r["broadcast"] == [10.0, 11.0, 12.0, 13.0]
            assert r["object"] == {"from": 0, "list": [1, "a"]}
        assert r0["gather"] == [0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0]
        assert r1["gather"] is None
        assert r0["groups"] == ([0, 1], [0], [0]) and r1["groups"] == ([0, 1], [1], [1])
        # an exception on one rank names it, and closes the pool
        with pytest.raises(RuntimeError, match="rank 1 failed: ValueError: rank 1 refuses"):
            pool.run(rank_fns.fail_on_rank_1)
        assert pool.procs == []


def test_dead_rank_is_named_and_nothing_is_left():
    pool = RankPool(2)
    procs = list(pool.procs)
    with pytest.raises(RuntimeError, match=r"rank 1 .*(died|ended)"):
        pool.run(rank_fns.exit_on_rank_1)
    assert all(not p.is_alive() for p in procs)
