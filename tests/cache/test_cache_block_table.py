"""BlockTable row operations and the vectorised slot mapping."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lab.cache import BlockTable


def test_row_ops() -> None:
    bt = BlockTable(4, 5)
    bt.add_row(0, [3, 4])
    bt.append_row(0, [7])
    assert bt.get_row(0).tolist() == [3, 4, 7] and bt.num_blocks_per_row[0] == 3
    bt.add_row(1, [9])
    bt.move_row(0, 2)
    assert bt.get_row(2).tolist() == [3, 4, 7]
    bt.swap_row(1, 2)
    assert bt.get_row(1).tolist() == [3, 4, 7] and bt.get_row(2).tolist() == [9]
    bt.clear_row(1)
    assert bt.get_row(1).tolist() == [] and bt.block_table.dtype == np.int32
    bt.add_row(0, [1, 2])
    assert bt.get_row(0).tolist() == [1, 2]
    with pytest.raises(ValueError):
        bt.append_row(0, [1, 2, 3, 4])


@given(st.data())
def test_slot_mapping_matches_naive_loop(data) -> None:
    bs = data.draw(st.sampled_from([1, 2, 4, 16]))
    max_blocks, num_reqs = 6, data.draw(st.integers(1, 4))
    bt = BlockTable(num_reqs, max_blocks)
    lens = []
    for r in range(num_reqs):
        ids = data.draw(st.lists(st.integers(0, 1000), min_size=1, max_size=max_blocks))
        bt.add_row(r, ids)
        lens.append(len(ids) * bs)
    toks = data.draw(st.lists(st.integers(0, num_reqs - 1).flatmap(
        lambda r: st.tuples(st.just(r), st.integers(0, lens[r] - 1))), max_size=30))
    req = np.array([t[0] for t in toks], dtype=np.int32)
    pos = np.array([t[1] for t in toks], dtype=np.int64)
    got = bt.compute_slot_mapping(req, pos, bs)
    naive = [int(bt.block_table[r, p // bs]) * bs + p % bs for r, p in toks]
    assert got.dtype == np.int64 and got.tolist() == naive


def test_slot_mapping_rejects_out_of_range() -> None:
    bt = BlockTable(1, 2)
    with pytest.raises(ValueError):
        bt.compute_slot_mapping(np.array([0]), np.array([8]), 4)
