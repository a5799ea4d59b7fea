"""PersistentBatch: its row bookkeeping, and BatchUpdates that replay (base.py's order) into
exactly the batch it holds."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lab.core.sampling_params import SamplingParams
from lab.logits_processors.base import MoveDirectionality as Dir
from lab.logits_processors.base import MovedRequest
from lab.worker.persistent_batch import PersistentBatch

P = SamplingParams()


def replay(rows: dict, update) -> None:
    """Apply a BatchUpdate to {row: serial} the way a processor must: removed, added, moved."""
    if update is None:
        return
    for i in update.removed:
        assert i in rows, "removed a row that held nothing"
        del rows[i]
    for added in update.added:
        rows[added.index] = added.prompt_token_ids[0]  # may overwrite a row whose request moved
    for src, dst, direction in update.moved:
        if direction is Dir.UNIDIRECTIONAL:
            assert src in rows and dst not in rows, "a one-way move goes into a hole"
            rows[dst] = rows.pop(src)
        else:
            a, b = rows.pop(src, None), rows.pop(dst, None)
            rows.update({k: v for k, v in ((dst, a), (src, b)) if v is not None})


def check_invariants(batch: PersistentBatch, live: dict) -> None:
    """req_ids/index_of agree with the requests added and not removed; no trailing hole."""
    ids = batch.req_ids
    assert batch.num_reqs == len(live) == sum(r is not None for r in ids)
    assert not ids or ids[-1] is not None
    for req_id in live:
        assert ids[batch.index_of(req_id)] == req_id


def truth(batch: PersistentBatch, serial_of: dict) -> dict:
    """{row: serial} of what the batch holds now."""
    return {i: serial_of[r] for i, r in enumerate(batch.req_ids) if r is not None}


OPS = st.lists(st.sampled_from(["add", "add", "remove", "condense", "swap"]), max_size=10)


@given(st.data(), st.lists(OPS, min_size=1, max_size=6), st.integers(1, 8))
def test_updates_replay_into_the_batch(data, steps, max_num_reqs):
    """Random adds/removes/condenses/swaps in any order; one take_update per step."""
    batch, rows, serial_of, serial = PersistentBatch(max_num_reqs), {}, {}, 0
    for ops in steps:
        for op in ops:
            live = list(serial_of)
            if op == "add" and len(live) < max_num_reqs:
                req_id = data.draw(st.sampled_from([f"r{k}" for k in range(12)]))
                if req_id in serial_of:
                    continue
                holes = [i for i, r in enumerate(batch.req_ids) if r is None]
                serial += 1
                out = []
                index = batch.add(req_id, P, [serial], out)
                assert index == (holes[0] if holes else len(live))  # lowest hole, else append
                serial_of[req_id] = serial
            elif op == "remove" and live:
                req_id = data.draw(st.sampled_from(live))
                index = batch.index_of(req_id)
                assert batch.remove(req_id) == index
                assert batch.req_ids[index:index + 1] in ([], [None])  # a hole (or trimmed)
                del serial_of[req_id]
            elif op == "condense":
                batch.condense()
                assert batch.is_dense
                assert sorted(batch.req_ids) == sorted(serial_of)
            elif op == "swap" and live:
                a, b = (batch.index_of(data.draw(st.sampled_from(live))) for _ in range(2))
                batch.swap(a, b)
            check_invariants(batch, serial_of)
        update = batch.take_update()
        replay(rows, update)
        assert rows == truth(batch, serial_of)
        if update is not None:
            assert update.batch_size == batch.num_reqs
            assert not set(update.removed) & {a.index for a in update.added}
        assert batch.take_update() is None  # nothing changed since


def test_condense_moves_the_highest_rows_down_like_vllm():
    """Removes, an add reusing the lowest hole, then condense: one-way moves from the top."""
    batch = PersistentBatch(8)
    for k in range(6):
        batch.add(f"r{k}", P, [k], [])
    batch.take_update()
    batch.remove("r1")
    batch.remove("r2")
    batch.remove("r4")
    assert batch.add("new", P, [9], []) == 1
    batch.condense()
    update = batch.take_update()
    assert list(update.removed) == [2, 4]
    assert [(a.index, a.prompt_token_ids) for a in update.added] == [(1, [9])]
    assert list(update.moved) == [MovedRequest(5, 2, Dir.UNIDIRECTIONAL)]
    assert batch.req_ids == ["r0", "new", "r5", "r3"] and update.batch_size == 4


def test_swap_and_trailing_remove():
    """A swap is one SWAP; removing the last row needs no move; an add-then-remove is nothing."""
    batch = PersistentBatch(4)
    for k in range(3):
        batch.add(f"r{k}", P, [k], [])
    batch.take_update()
    batch.swap(0, 2)
    assert batch.take_update().moved == [MovedRequest(0, 2, Dir.SWAP)]
    batch.remove("r0")  # now at row 2, the last
    batch.condense()
    update = batch.take_update()
    assert list(update.removed) == [2] and not update.moved and update.batch_size == 2
    batch.add("x", P, [7], [])
    batch.remove("x")
    assert batch.take_update() is None
    with pytest.raises(ValueError):
        batch.add("r1", P, [1], [])
    with pytest.raises(KeyError):
        batch.remove("nope")


def test_full_batch_refuses_an_add():
    """max_num_reqs is a hard limit."""
    batch = PersistentBatch(2)
    batch.add("a", P, None, [])
    batch.add("b", P, None, [])
    with pytest.raises(ValueError, match="full"):
        batch.add("c", P, None, [])
