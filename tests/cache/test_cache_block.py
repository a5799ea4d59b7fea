"""KVCacheBlock and FreeKVCacheBlockQueue."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lab.cache import FreeKVCacheBlockQueue, KVCacheBlock


def _queue(n: int) -> tuple[list[KVCacheBlock], FreeKVCacheBlockQueue]:
    blocks = [KVCacheBlock(i) for i in range(n)]
    return blocks, FreeKVCacheBlockQueue(blocks)


def _ids(q: FreeKVCacheBlockQueue) -> list[int]:
    return [b.block_id for b in q.get_all_free_blocks()]


def test_block_hash_set_once_and_reset() -> None:
    b = KVCacheBlock(3)
    assert b.block_hash is None and b.ref_cnt == 0 and not b.is_null
    b.block_hash = b"x"
    with pytest.raises(ValueError):
        b.block_hash = b"y"
    b.reset_hash()
    b.block_hash = b"y"
    assert b.block_hash == b"y"


def test_queue_starts_in_id_order() -> None:
    _, q = _queue(5)
    assert _ids(q) == [0, 1, 2, 3, 4]
    assert q.num_free_blocks == len(q) == 5


def test_popleft_remove_append() -> None:
    blocks, q = _queue(5)
    assert q.popleft() is blocks[0]
    q.remove(blocks[2])
    assert _ids(q) == [1, 3, 4]
    q.append(blocks[2])
    q.append(blocks[0])
    assert _ids(q) == [1, 3, 4, 2, 0]
    assert q.num_free_blocks == 5
    assert blocks[3] in q
    q.remove(blocks[3])
    assert blocks[3] not in q
    with pytest.raises(ValueError):
        q.remove(blocks[3])
    with pytest.raises(ValueError):
        q.append(blocks[4])  # already linked


def test_popleft_n_and_append_n() -> None:
    blocks, q = _queue(6)
    got = q.popleft_n(4)
    assert [b.block_id for b in got] == [0, 1, 2, 3]
    assert all(b.prev_free_block is None and b.next_free_block is None for b in got)
    assert _ids(q) == [4, 5]
    with pytest.raises(ValueError):
        q.popleft_n(3)
    q.append_n([blocks[2], blocks[0]])
    assert _ids(q) == [4, 5, 2, 0]
    assert q.popleft_n(0) == []


def test_empty_queue() -> None:
    _, q = _queue(1)
    q.popleft()
    assert q.num_free_blocks == 0 and q.get_all_free_blocks() == []
    with pytest.raises(ValueError):
        q.popleft()


@given(st.lists(st.tuples(st.sampled_from(["pop", "popn", "remove", "append"]),
                          st.integers(0, 9)), max_size=40))
def test_queue_matches_list_model(ops: list[tuple[str, int]]) -> None:
    blocks, q = _queue(10)
    model = list(range(10))
    for op, arg in ops:
        out = [b for b in blocks if b.block_id not in model]
        if op == "pop" and model:
            assert q.popleft().block_id == model.pop(0)
        elif op == "popn":
            n = min(arg, len(model))
            assert [b.block_id for b in q.popleft_n(n)] == model[:n]
            del model[:n]
        elif op == "remove" and arg in model:
            q.remove(blocks[arg])
            model.remove(arg)
        elif op == "append" and out:
            q.append(out[arg % len(out)])
            model.append(out[arg % len(out)].block_id)
        assert _ids(q) == model and q.num_free_blocks == len(model)
