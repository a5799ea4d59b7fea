"""BlockTable: the worker's per-request block ids (numpy, int32) and the slot mapping.

Row r lists the blocks of the request in batch slot r; only the first num_blocks_per_row[r]
entries are meaningful:

    table[r] = | block ids (num_blocks_per_row[r]) | stale / zero ... | (max_blocks_per_req)

Token at position p of row r lives in slot table[r, p // bs] * bs + p % bs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class BlockTable:
    """A [max_num_reqs, max_blocks_per_req] int32 table of block ids plus per-row lengths."""

    def __init__(self, max_num_reqs: int, max_blocks_per_req: int) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_blocks_per_req = max_blocks_per_req
        self.block_table = np.zeros((max_num_reqs, max_blocks_per_req), dtype=np.int32)
        self.num_blocks_per_row = np.zeros(max_num_reqs, dtype=np.int32)

    def append_row(self, row: int, block_ids: Sequence[int] | np.ndarray) -> None:
        """Append block ids to the end of `row`. Raises if the row would overflow."""
        n = len(block_ids)
        if n == 0:
            return
        start = int(self.num_blocks_per_row[row])
        end = start + n
        if end > self.max_blocks_per_req:
            raise ValueError(f"row {row}: {end} blocks exceed max {self.max_blocks_per_req}")
        self.block_table[row, start:end] = block_ids
        self.num_blocks_per_row[row] = end

    def add_row(self, row: int, block_ids: Sequence[int] | np.ndarray) -> None:
        """Set `row` to exactly `block_ids`."""
        self.num_blocks_per_row[row] = 0
        self.append_row(row, block_ids)

    def truncate_row(self, row: int, num_blocks: int) -> None:
        """Keep the first `num_blocks` blocks of `row` (all of them if it has fewer)."""
        self.num_blocks_per_row[row] = min(int(self.num_blocks_per_row[row]), num_blocks)

    def clear_row(self, row: int) -> None:
        """Empty `row`."""
        self.num_blocks_per_row[row] = 0
        self.block_table[row] = 0

    def move_row(self, src: int, dst: int) -> None:
        """Copy row `src` into row `dst` (src is left as is)."""
        n = int(self.num_blocks_per_row[src])
        self.block_table[dst, :n] = self.block_table[src, :n]
        self.num_blocks_per_row[dst] = n

    def swap_row(self, a: int, b: int) -> None:
        """Exchange rows `a` and `b`."""
        self.block_table[[a, b]] = self.block_table[[b, a]]
        self.num_blocks_per_row[[a, b]] = self.num_blocks_per_row[[b, a]]

    def get_row(self, row: int) -> np.ndarray:
        """The valid block ids of `row` (a view)."""
        return self.block_table[row, : int(self.num_blocks_per_row[row])]

    def compute_slot_mapping(
        self, req_indices: np.ndarray, positions: np.ndarray, block_size: int
    ) -> np.ndarray:
        """Slot of each token: table[req, pos // bs] * bs + pos % bs, as int64 (vectorised)."""
        req_indices = np.asarray(req_indices, dtype=np.int64)
        positions = np.asarray(positions, dtype=np.int64)
        block_idx = positions // block_size
        if block_idx.size and int(block_idx.max()) >= self.max_blocks_per_req:
            raise ValueError(f"position needs block {int(block_idx.max())} >= max blocks")
        block_ids = self.block_table[req_indices, block_idx].astype(np.int64)
        return block_ids * block_size + positions % block_size


class GroupBlockTables:
    """One BlockTable per KV cache group (lab/cache/groups.py), rows moved together: a request's
    row holds its block ids in every group (the scheduler sends one list per group)."""

    def __init__(self, num_groups: int, max_num_reqs: int, max_blocks_per_req: int) -> None:
        if num_groups < 1:
            raise ValueError(f"num_groups={num_groups} must be >= 1")
        self.tables = [BlockTable(max_num_reqs, max_blocks_per_req) for _ in range(num_groups)]
        self.max_blocks_per_req = max_blocks_per_req

    def __getitem__(self, group: int) -> BlockTable:
        return self.tables[group]

    def __len__(self) -> int:
        return len(self.tables)

    def group(self, group: int) -> GroupBlockTables:
        """One group's table as a GroupBlockTables of its own, shared (not copied), so it
        follows every row change: e.g. the block table a draft model's KV is paged by."""
        view = GroupBlockTables.__new__(GroupBlockTables)
        view.tables = [self.tables[group]]
        view.max_blocks_per_req = self.max_blocks_per_req
        return view

    def append_row(self, row: int, block_ids: Sequence[Sequence[int]]) -> None:
        """Append each group's new block ids to `row`."""
        self._check(block_ids)
        for table, ids in zip(self.tables, block_ids):
            table.append_row(row, ids)

    def add_row(self, row: int, block_ids: Sequence[Sequence[int]]) -> None:
        """Set `row` of each group to exactly its block ids."""
        self._check(block_ids)
        for table, ids in zip(self.tables, block_ids):
            table.add_row(row, ids)

    def truncate_row(self, row: int, num_blocks: int) -> None:
        """Keep the first `num_blocks` blocks of `row` in each group."""
        for table in self.tables:
            table.truncate_row(row, num_blocks)

    def clear_row(self, row: int) -> None:
        for table in self.tables:
            table.clear_row(row)

    def _check(self, block_ids: Sequence[Sequence[int]]) -> None:
        if len(block_ids) != len(self.tables):
            raise ValueError(f"got block ids of {len(block_ids)} KV cache groups for a cache of "
                             f"{len(self.tables)}")
