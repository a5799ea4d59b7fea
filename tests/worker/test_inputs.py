"""The step's inputs (lab/worker/inputs.py) from the persistent buffers (lab/worker/buffers.py):
prepare_inputs against a per-token Python definition, the padded decode's real and padding
rows, and the host -> device copy path (run on a CPU with two tensors per buffer)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lab.cache.block_table import BlockTable, GroupBlockTables
from lab.worker.buffers import CopyFence, CpuGpuBuffer, InputBuffers
from lab.worker.inputs import BatchRows, prepare_inputs, prepare_padded_decode

BS, MAX_LEN, MAX_REQS = 4, 32, 6
CPU = torch.device("cpu")


GROUPS = 2  # KV cache groups: each its own block table and slot mapping
LAYER_GROUPS = (1, 0, 1)


def tables(seed: int = 0, groups: int = 1) -> tuple[np.ndarray, GroupBlockTables]:
    rng = np.random.default_rng(seed)
    token_ids = rng.integers(3, 1000, size=(MAX_REQS, MAX_LEN + 1))
    table = GroupBlockTables(groups, MAX_REQS, MAX_LEN // BS)
    for r in range(MAX_REQS):
        table.add_row(r, [rng.permutation(np.arange(1, 60))[: MAX_LEN // BS]
                          for _ in range(groups)])
    return token_ids, table


def expected(batch: BatchRows, token_ids, table: BlockTable) -> dict:
    """Per token, in plain Python (the definition in the module docstring)."""
    ids, pos, slots, qsl = [], [], [], [0]
    for row, c, n in zip(batch.rows, batch.num_computed, batch.num_scheduled):
        for p in range(c, c + n):
            ids.append(token_ids[row, p])
            pos.append(p)
            slots.append(table.block_table[row, p // BS] * BS + p % BS)
        qsl.append(qsl[-1] + n)
    return dict(ids=ids, pos=pos, slots=slots, qsl=qsl,
                seq=(batch.num_computed + batch.num_scheduled).tolist())


BATCHES = st.integers(1, MAX_REQS).flatmap(lambda b: st.tuples(
    st.permutations(range(MAX_REQS)).map(lambda p: p[:b]),
    st.lists(st.tuples(st.integers(0, 20), st.integers(1, 8), st.integers(0, 3)),
             min_size=b, max_size=b)))


@pytest.mark.parametrize("share", [None, False])
@given(BATCHES)
def test_prepare_inputs_matches_the_definition(share, drawn):
    perm, reqs = drawn
    batch = BatchRows(np.array(perm, dtype=np.int64), np.array([c for c, _, _ in reqs]),
                      np.array([n for _, n, _ in reqs]),
                      np.array([c + n + extra for c, n, extra in reqs]))
    token_ids, table = tables(groups=GROUPS)
    bufs = InputBuffers(MAX_REQS, 64, MAX_LEN // BS, CPU, share=share, num_groups=GROUPS)
    step = prepare_inputs(batch, token_ids, table, BS, MAX_LEN, bufs, layer_groups=LAYER_GROUPS)
    want = expected(batch, token_ids, table[0])
    a = step.attn_inputs
    assert step.input_ids.tolist() == want["ids"] and step.positions.tolist() == want["pos"]
    assert a.slot_mapping.tolist() == want["slots"] and a.query_start_loc.tolist() == want["qsl"]
    assert a.seq_lens.tolist() == want["seq"] == a.seq_lens_cpu
    assert a.num_computed_tokens.tolist() == batch.num_computed.tolist()
    width = -(-max(want["seq"]) // BS)
    assert a.block_table.tolist() == table[0].block_table[batch.rows, :width].tolist()
    assert a.layer_groups == LAYER_GROUPS and len(a.group_tables) == GROUPS
    for g, (group_table, group_slots) in enumerate(a.group_tables):  # each group's own
        assert group_slots.tolist() == expected(batch, token_ids, table[g])["slots"]
        assert group_table.tolist() == table[g].block_table[batch.rows, :width].tolist()
    assert step.logits_indices.tolist() == [q - 1 for q in want["qsl"][1:]]
    assert step.sampled.tolist() == [extra == 0 for _, _, extra in reqs]
    assert step.padded_size is None


@pytest.mark.parametrize("share", [None, False])
def test_padded_decode_rows(share):
    """Real rows as the eager step has them; padding rows write and read slot 0 of the null
    block only; the tensors are views of the static buffers' first P rows."""
    token_ids, table = tables(1)
    batch = BatchRows(np.array([4, 0, 2]), np.array([5, 17, 9]), np.ones(3, dtype=np.int64),
                      np.array([6, 18, 12]))
    bufs = InputBuffers(MAX_REQS, 64, MAX_LEN // BS, CPU, share=share)
    eager = prepare_inputs(batch, token_ids, table, BS, MAX_LEN, bufs)
    eager = {k: v.tolist() for k, v in [("ids", eager.input_ids), ("pos", eager.positions),
                                        ("slots", eager.attn_inputs.slot_mapping),
                                        ("seq", eager.attn_inputs.seq_lens)]}
    step = prepare_padded_decode(batch, token_ids, table, BS, MAX_LEN, bufs, size=5)
    a = step.attn_inputs
    assert step.padded_size == 5 and a.num_reqs == a.num_actual_tokens == 5
    assert step.input_ids.tolist() == eager["ids"] + [0, 0]
    assert step.positions.tolist() == eager["pos"] + [0, 0]
    assert a.slot_mapping.tolist() == eager["slots"] + [0, 0]  # block 0 (null), offset 0
    assert a.seq_lens.tolist() == eager["seq"] + [1, 1]
    assert a.num_computed_tokens.tolist() == [5, 17, 9, 0, 0]
    assert a.query_start_loc.tolist() == list(range(6)) and a.max_query_len == 1
    assert a.block_table.shape == (5, MAX_LEN // BS) and a.max_seq_len == MAX_LEN
    assert a.block_table[:3].tolist() == table[0].block_table[[4, 0, 2]].tolist()
    assert not a.block_table[3:].any()
    assert step.logits_indices.tolist() == [0, 1, 2]
    assert step.sampled.tolist() == [True, True, False]
    assert a.seq_lens.data_ptr() == bufs.seq_lens.gpu.data_ptr()  # a view: what graphs read
    with pytest.raises(ValueError, match="one token per request"):
        prepare_padded_decode(BatchRows(batch.rows, batch.num_computed, np.array([1, 2, 1]),
                                        batch.num_tokens), token_ids, table, BS, MAX_LEN, bufs, 5)


def test_buffers_copy_and_refuse_oversized_steps():
    buf = CpuGpuBuffer(4, dtype=torch.int32, device=CPU, share=False)
    buf.np[:3] = [7, 8, 9]
    assert buf.gpu.data_ptr() != buf.cpu.data_ptr()
    assert buf.to_device(3).tolist() == [7, 8, 9] and buf.gpu[3] == 0
    shared = CpuGpuBuffer(4, dtype=torch.int32, device=CPU)
    assert shared.gpu is shared.cpu  # a CPU device: no copy at all
    fence = CopyFence(CPU)
    fence.record()
    fence.wait()  # nothing to wait for on a CPU
    bufs = InputBuffers(2, 8, 4, CPU)
    with pytest.raises(ValueError, match="9 tokens .* max_num_batched_tokens"):
        bufs.check_fits(9, 2)
