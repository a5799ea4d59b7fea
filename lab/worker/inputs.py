"""Turning the persistent batch into the step's tensors (vectorised numpy into the runner's
persistent buffers, lab/worker/buffers.py, then one copy each).

For the batch's requests (rows 0..B-1) with num_computed c[i] and new tokens n[i] (flattened
back to back):

    query_start_loc = [0, n0, n0+n1, ...]            token t belongs to request req_idx[t]
    positions[t]    = c[req_idx[t]] + (t - query_start_loc[req_idx[t]])
    slot_mapping[t] = block_table[row, pos // bs] * bs + pos % bs
    seq_lens[i]     = c[i] + n[i]
    logits_indices  = query_start_loc[1:] - 1: every request's last token (a partial prefill
                      is sampled too, as in vLLM, so the batch's rows stay the persistent
                      batch's rows; `sampled` says whose token is kept)

The padded decode (`prepare_padded_decode`, every n[i] = 1, B padded to a capture size P): rows
B..P-1 are padding requests that write slot 0 of the null block 0 and read only it:

    rows:          | 0 .. B-1: the batch's decodes | B .. P-1: padding                   |
    input_ids      | token at position c[i]        | 0                                   |
    positions      | c[i]                          | 0                                   |
    slot_mapping   | the slot of c[i]              | 0 (block 0, offset 0: never a real) |
    seq_lens       | c[i] + 1                      | 1                                   |
    block_table    | the row's blocks (full width) | 0 ...                               |

Its AttentionInputs are views of the buffers' first P rows (the block table at its full width,
max_seq_len = max_model_len): what a captured graph reads at every replay.

A hybrid KV cache (several KV cache groups, lab/cache/groups.py) has a block table and a slot
mapping per group, computed alike; AttentionInputs carries them all (`group_tables`, with each
layer's group) and the backend builds one metadata per group (build_step_metadata).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lab.attention.base import AttentionInputs, KVScales
from lab.cache.block_table import GroupBlockTables
from lab.worker.buffers import InputBuffers


class InputRows:
    """A RowStore (lab/worker/persistent_batch.py) of what the inputs need per batch row: the
    request's row of the token / block tables, its computed tokens, the tokens it holds."""

    def __init__(self, max_num_reqs: int) -> None:
        self.token_row = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_computed = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self._arrays = (self.token_row, self.num_computed, self.num_tokens)

    def set_row(self, index: int, token_row: int, num_computed: int, num_tokens: int) -> None:
        self.token_row[index] = token_row
        self.num_computed[index] = num_computed
        self.num_tokens[index] = num_tokens

    def move(self, src: int, dst: int) -> None:
        for a in self._arrays:
            a[dst] = a[src]

    def swap(self, a: int, b: int) -> None:
        for arr in self._arrays:
            arr[[a, b]] = arr[[b, a]]

    def clear(self, index: int) -> None:
        for a in self._arrays:
            a[index] = 0

    def step(self, num_scheduled: np.ndarray) -> BatchRows:
        """This step's rows 0..B-1 (B = len(num_scheduled)): copies, so advancing the counts
        after the forward leaves the step's view as it was."""
        b = len(num_scheduled)
        return BatchRows(self.token_row[:b].copy(), self.num_computed[:b].copy(), num_scheduled,
                         self.num_tokens[:b].copy())


@dataclass
class BatchRows:
    """Per-request host arrays of the step's requests, in batch order."""

    rows: np.ndarray  # row of each request in the token / block tables
    num_computed: np.ndarray  # tokens already in the KV cache
    num_scheduled: np.ndarray  # tokens computed this step
    num_tokens: np.ndarray  # tokens the request holds (prompt + outputs)

    @property
    def is_uniform_decode(self) -> bool:
        """Every request computes exactly one token."""
        return bool((self.num_scheduled == 1).all())


@dataclass
class StepBatch:
    """The model's inputs for one step and which requests keep their sampled token."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_inputs: AttentionInputs
    logits_indices: torch.Tensor  # [num_reqs]: the last scheduled token of every request
    sampled: np.ndarray  # bool [num_reqs]: the request's prompt is complete (keeps its token)
    token_starts: np.ndarray  # [num_reqs]: each request's first token in the flat batch
    padded_size: int | None = None  # the padded decode's P (rows num_reqs..P-1 are padding)

    @property
    def any_sampled(self) -> bool:
        return bool(self.sampled.any())


def prepare_inputs(
    batch: BatchRows, token_ids: np.ndarray, block_table: GroupBlockTables, block_size: int,
    max_model_len: int, bufs: InputBuffers, kv_scales: KVScales | None = None,
    layer_groups: tuple[int, ...] = (),
) -> StepBatch:
    """Build the step's flat input ids, positions, slot mappings and attention inputs (which
    carry the cache's fp8 `kv_scales`, if any, to the backend)."""
    n = batch.num_scheduled
    num_reqs = len(n)
    cu = np.cumsum(n)
    total = int(cu[-1])
    bufs.check_fits(total, num_reqs)
    starts = cu - n
    if total == num_reqs:  # one token each: no expansion
        positions, token_rows = batch.num_computed, batch.rows
    else:
        req_idx = np.repeat(np.arange(num_reqs), n)
        positions = batch.num_computed[req_idx] + (np.arange(total) - starts[req_idx])
        token_rows = batch.rows[req_idx]
    bufs.input_ids.np[:total] = token_ids[token_rows, positions]
    bufs.positions.np[:total] = positions
    seq_lens = batch.num_computed + n
    max_seq_len = int(seq_lens.max())
    width = -(-max_seq_len // block_size)
    tables = []
    for g, table in enumerate(block_table.tables):
        bufs.slot_mappings[g].np[:total] = table.compute_slot_mapping(token_rows, positions,
                                                                      block_size)
        bufs.table(num_reqs, width, g)[:] = table.block_table[batch.rows, :width]
        tables.append((bufs.table_to_device(num_reqs, width, g),
                       bufs.slot_mappings[g].to_device(total)))
    _fill_request_rows(bufs, cu, seq_lens, batch.num_computed)
    bufs.logits_indices.np[:num_reqs] = cu - 1
    attn = AttentionInputs(
        query_start_loc=bufs.query_start_loc.to_device(num_reqs + 1),
        seq_lens=bufs.seq_lens.to_device(num_reqs),
        num_computed_tokens=bufs.num_computed.to_device(num_reqs),
        block_table=tables[0][0],
        slot_mapping=tables[0][1],
        num_reqs=num_reqs,
        num_actual_tokens=total,
        max_query_len=int(n.max()),
        max_seq_len=max_seq_len,
        block_size=block_size,
        query_lens_cpu=n.tolist(),
        seq_lens_cpu=seq_lens.tolist(),
        max_model_len=max_model_len,
        kv_scales=kv_scales,
        **_groups(tables, layer_groups),
    )
    return StepBatch(
        input_ids=bufs.input_ids.to_device(total),
        positions=bufs.positions.to_device(total),
        attn_inputs=attn,
        logits_indices=bufs.logits_indices.to_device(num_reqs),
        sampled=seq_lens >= batch.num_tokens,
        token_starts=starts,
    )


def spec_logits_indices(batch: StepBatch, rows: BatchRows, drafts: np.ndarray,
                        device: torch.device) -> torch.Tensor:
    """The logits rows of a step with drafts (speculative decoding): request i's last
    drafts[i] + 1 tokens (the positions its drafts are verified at, and the one after), request
    by request; the step's other requests keep their last token."""
    ends = batch.token_starts + rows.num_scheduled  # one past each request's last token
    counts = drafts + 1
    firsts = np.repeat(ends - counts, counts)
    offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    return torch.from_numpy(firsts + offsets).to(device)


def _groups(tables: list[tuple[torch.Tensor, torch.Tensor]], layer_groups: tuple[int, ...]
            ) -> dict:
    """AttentionInputs' group fields: every group's (block table, slot mapping) and each
    layer's group when there are several groups; none for one."""
    if len(tables) == 1:
        return {}
    return dict(group_tables=tuple(tables), layer_groups=tuple(layer_groups))


def _fill_request_rows(bufs: InputBuffers, cu: np.ndarray, seq_lens: np.ndarray,
                       num_computed: np.ndarray) -> None:
    """query_start_loc, seq_lens and num_computed of requests 0..len(cu)-1."""
    b = len(cu)
    bufs.query_start_loc.np[0] = 0
    bufs.query_start_loc.np[1 : b + 1] = cu
    bufs.seq_lens.np[:b] = seq_lens
    bufs.num_computed.np[:b] = num_computed


def prepare_padded_decode(
    batch: BatchRows, token_ids: np.ndarray, block_table: GroupBlockTables, block_size: int,
    max_model_len: int, bufs: InputBuffers, size: int, layer_groups: tuple[int, ...] = (),
) -> StepBatch:
    """A uniform decode batch of B requests padded to `size` rows of the static buffers (module
    docstring); the returned StepBatch's tensors are views of the buffers' first `size` rows."""
    b, pos, rows = len(batch.num_scheduled), batch.num_computed, batch.rows
    if not batch.is_uniform_decode or not b <= size <= bufs.max_num_reqs:
        raise ValueError(f"a padded decode needs one token per request and {b} <= size={size} "
                         f"<= {bufs.max_num_reqs}")
    bufs.input_ids.np[:b] = token_ids[rows, pos]
    bufs.positions.np[:b] = pos
    for g, table in enumerate(block_table.tables):
        bufs.slot_mappings[g].np[:b] = table.compute_slot_mapping(rows, pos, block_size)
        bufs.table(size, bufs.max_blocks, g)[:b] = table.block_table[rows]
    bufs.seq_lens.np[:b] = pos + 1
    bufs.num_computed.np[:b] = pos
    _write_padding(bufs, b, size)
    _copy_static(bufs, size)
    bufs.logits_indices.np[:b] = np.arange(b)
    seq_lens_cpu = bufs.seq_lens.np[:size].tolist()
    return StepBatch(
        input_ids=bufs.input_ids.gpu[:size],
        positions=bufs.positions.gpu[:size],
        attn_inputs=static_decode_inputs(bufs, size, block_size, max_model_len, seq_lens_cpu,
                                         layer_groups),
        logits_indices=bufs.logits_indices.to_device(b),
        sampled=pos + 1 >= batch.num_tokens,
        token_starts=np.arange(b),
        padded_size=size,
    )


def fill_padding(bufs: InputBuffers, size: int) -> None:
    """Rows 0..size-1 of the static buffers all padding, on the device (capture warm-ups)."""
    _write_padding(bufs, 0, size)
    _copy_static(bufs, size)


def _write_padding(bufs: InputBuffers, start: int, size: int) -> None:
    """Host rows start..size-1 as padding requests (module docstring); query_start_loc of all
    `size` rows (one token each)."""
    for buf, pad in ((bufs.input_ids, 0), (bufs.positions, 0), (bufs.seq_lens, 1),
                     (bufs.num_computed, 0), *((slots, 0) for slots in bufs.slot_mappings)):
        buf.np[start:size] = pad
    for g in range(len(bufs.block_tables)):
        bufs.table(size, bufs.max_blocks, g)[start:] = 0
    bufs.query_start_loc.np[: size + 1] = np.arange(size + 1)


def _copy_static(bufs: InputBuffers, size: int) -> None:
    """The first `size` rows of the static buffers to the device."""
    for buf in (bufs.input_ids, bufs.positions, bufs.seq_lens, bufs.num_computed,
                *bufs.slot_mappings):
        buf.to_device(size)
    bufs.query_start_loc.to_device(size + 1)
    for table in bufs.block_tables:
        table.to_device(size * bufs.max_blocks)


def static_decode_inputs(bufs: InputBuffers, size: int, block_size: int, max_model_len: int,
                         seq_lens_cpu: list[int], layer_groups: tuple[int, ...] = ()
                         ) -> AttentionInputs:
    """The AttentionInputs of a padded decode of `size` rows: views of the device buffers (the
    host copies are those of the batch it is built for: a graph-safe backend never reads
    them)."""
    tables = [(table.gpu[: size * bufs.max_blocks].view(size, bufs.max_blocks), slots.gpu[:size])
              for table, slots in zip(bufs.block_tables, bufs.slot_mappings)]
    return AttentionInputs(
        query_start_loc=bufs.query_start_loc.gpu[: size + 1],
        seq_lens=bufs.seq_lens.gpu[:size],
        num_computed_tokens=bufs.num_computed.gpu[:size],
        block_table=tables[0][0],
        slot_mapping=tables[0][1],
        num_reqs=size,
        num_actual_tokens=size,
        max_query_len=1,
        max_seq_len=max_model_len,
        block_size=block_size,
        query_lens_cpu=[1] * size,
        seq_lens_cpu=seq_lens_cpu,
        max_model_len=max_model_len,
        **_groups(tables, layer_groups),
    )
