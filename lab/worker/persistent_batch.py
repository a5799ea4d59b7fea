"""PersistentBatch: the dense request batch the model runner keeps across steps.

vLLM V1's InputBatch index bookkeeping: which request lives at which batch row, where a new
request goes, how the batch is kept dense, and the `BatchUpdate` that tells the logits
processors (lab.logits_processors.base) what changed since they last looked. The per-row data
lives in `RowStore`s the batch is built with (the runner's input rows, lab/worker/inputs.py; the
sampling parameters, lab/worker/sampling_state.py; the request states, `ObjectRows`): whoever
adds a request writes its row in each store (at the index `add` returns); the batch moves rows
in every store when it condenses or swaps, and clears a removed request's row. So row i of
every store belongs to `req_ids[i]`, and a step reads its rows as slices [:num_reqs].

Invariants (checked by tests/worker/test_persistent_batch.py):
- `req_ids[i]` is the request at row i, or None for a hole; `index_of(r)` is its inverse.
  `req_ids` never ends in a hole (trailing holes are trimmed), so `len(req_ids)` is one past the
  highest occupied row.
- `add` fills the lowest hole, else appends: rows stay as low as they can.
- `remove` leaves a hole; `condense` fills holes by moving the highest-index requests down (one
  UNIDIRECTIONAL move each, as vLLM's InputBatch.condense), after which rows 0..num_reqs-1 are
  exactly the requests (the batch is dense); `swap` trades two requests (a SWAP).
- `take_update()` returns what changed since its previous call (None: nothing) such that
  replaying it on the previous batch — `removed` first, then `added`, then `moved` in order
  (base.py's order) — gives exactly the current batch. `removed` lists only rows that held a
  request at the previous update and hold none after the adds; a row reused by an add is only
  in `added`. The runner calls it once per step, after condensing (`batch_size` = num_reqs:
  the logits rows are 0..num_reqs-1).

The runner's step order — removes, adds, then condense and swaps — is recorded as is (moves
included). Should an add or remove follow a move within one update, the recorded moves no longer
replay in base.py's order; the update is then derived from the rows' before/after occupants
instead: every request that changed row is reported as removed from its old row and added at its
new one (an AddedRequest carries the live output list, so a processor rebuilds its row). Correct
either way; the common order keeps processors' work to cheap row moves.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Protocol

from lab.core.sampling_params import SamplingParams
from lab.logits_processors.base import (
    AddedRequest,
    BatchUpdate,
    MoveDirectionality,
    MovedRequest,
)


class RowStore(Protocol):
    """Per-row data of the batch (max_num_reqs rows), kept in step with it."""

    def move(self, src: int, dst: int) -> None:
        """Row src's data now lives at dst (src is left as it is: it will be cleared or
        overwritten)."""

    def swap(self, a: int, b: int) -> None:
        """Rows a and b trade their data."""

    def clear(self, index: int) -> None:
        """The row's request left the batch: neutral data (and no reference to the request)."""


class ObjectRows:
    """A RowStore of one Python object per row (None: empty)."""

    def __init__(self, max_num_reqs: int) -> None:
        self.items: list[object | None] = [None] * max_num_reqs

    def move(self, src: int, dst: int) -> None:
        self.items[dst] = self.items[src]

    def swap(self, a: int, b: int) -> None:
        self.items[a], self.items[b] = self.items[b], self.items[a]

    def clear(self, index: int) -> None:
        self.items[index] = None


class PersistentBatch:
    """Request ids at dense batch rows, recording changes as logits-processor BatchUpdates and
    moving the rows of its stores."""

    def __init__(self, max_num_reqs: int, stores: Sequence[RowStore] = ()) -> None:
        """An empty batch of at most max_num_reqs rows, keeping `stores` in step."""
        if max_num_reqs < 1:
            raise ValueError(f"max_num_reqs must be at least 1, got {max_num_reqs}")
        self.max_num_reqs = max_num_reqs
        self.stores = list(stores)
        self._req_ids: list[str | None] = []
        self._slots: list[AddedRequest | None] = []  # the add record of the request at a row
        self._index: dict[str, int] = {}
        self._holes: list[int] = []  # min-heap of hole rows (lazy: stale entries are skipped)
        # Since the last take_update: each touched row's occupant before it (None: empty);
        # the adds/removes frozen at the first move; the moves; whether an add/remove came
        # after a move (then the update is derived from `_before`, see the module docstring).
        self._before: dict[int, AddedRequest | None] = {}
        self._frozen: tuple[list[int], list[AddedRequest]] | None = None
        self._moved: list[MovedRequest] = []
        self._reordered_after_move = False

    # ---- queries -------------------------------------------------------------------------

    @property
    def req_ids(self) -> list[str | None]:
        """Row i -> request id (None: a hole); a copy."""
        return list(self._req_ids)

    @property
    def num_reqs(self) -> int:
        """Requests in the batch."""
        return len(self._index)

    @property
    def is_dense(self) -> bool:
        """True when rows 0..num_reqs-1 hold all the requests (no holes)."""
        return len(self._req_ids) == len(self._index)

    @property
    def ids(self):
        """The request ids in the batch (a live set-like view: set operations run in C)."""
        return self._index.keys()

    @property
    def index_map(self) -> dict[str, int]:
        """Request id -> row, the live dict (read it, never write it): `.get` in hot loops."""
        return self._index

    def index_of(self, req_id: str) -> int:
        """The row of `req_id` (KeyError if it is not in the batch)."""
        return self._index[req_id]

    def __contains__(self, req_id: object) -> bool:
        """Whether a request id is in the batch."""
        return req_id in self._index

    def __len__(self) -> int:
        """Requests in the batch (num_reqs)."""
        return len(self._index)

    # ---- changes -------------------------------------------------------------------------

    def add(self, req_id: str, params: SamplingParams, prompt_token_ids: list[int] | None,
            output_token_ids: list[int]) -> int:
        """Put a request at the lowest hole (else at the end); return its row.
        `output_token_ids` is the request's live list (the runner appends to it)."""
        if req_id in self._index:
            raise ValueError(f"request {req_id!r} is already in the batch")
        if len(self._index) >= self.max_num_reqs:
            raise ValueError(f"the batch is full (max_num_reqs={self.max_num_reqs})")
        index = self._lowest_hole()
        if index is None:
            index = len(self._req_ids)
            self._req_ids.append(None)
            self._slots.append(None)
        self._touch(index)
        self._note_add_or_remove()
        self._req_ids[index] = req_id
        self._slots[index] = AddedRequest(index, params, prompt_token_ids, output_token_ids)
        self._index[req_id] = index
        return index

    def remove(self, req_id: str) -> int:
        """Take a request out, leaving a hole at its row (KeyError if absent); return the row."""
        index = self._index.pop(req_id)
        self._touch(index)
        self._note_add_or_remove()
        self._req_ids[index] = None
        self._slots[index] = None
        for store in self.stores:
            store.clear(index)
        heapq.heappush(self._holes, index)
        self._trim()
        return index

    def condense(self) -> None:
        """Fill every hole by moving the highest-index request into the lowest hole (one
        UNIDIRECTIONAL move each); afterwards the batch is dense."""
        while (hole := self._lowest_hole()) is not None:
            last = len(self._req_ids) - 1  # occupied: trailing holes are trimmed
            self._start_move(last, hole)
            req_id = self._req_ids[last]
            self._req_ids[hole], self._slots[hole] = req_id, self._slots[last]
            self._index[req_id] = hole
            for store in self.stores:
                store.move(last, hole)
                store.clear(last)
            self._moved.append(MovedRequest(last, hole, MoveDirectionality.UNIDIRECTIONAL))
            self._req_ids.pop()
            self._slots.pop()
            self._trim()

    def swap(self, i: int, j: int) -> None:
        """Trade the requests at rows i and j (both must hold one); records a SWAP."""
        n = len(self._req_ids)
        if not (0 <= i < n and 0 <= j < n) or self._req_ids[i] is None \
                or self._req_ids[j] is None:
            raise ValueError(f"swap({i}, {j}): both rows must hold a request")
        if i == j:
            return
        self._start_move(i, j)
        self._req_ids[i], self._req_ids[j] = self._req_ids[j], self._req_ids[i]
        self._slots[i], self._slots[j] = self._slots[j], self._slots[i]
        self._index[self._req_ids[i]] = i
        self._index[self._req_ids[j]] = j
        for store in self.stores:
            store.swap(i, j)
        self._moved.append(MovedRequest(i, j, MoveDirectionality.SWAP))

    def take_update(self) -> BatchUpdate | None:
        """What changed since the last call (base.py's order), or None if nothing did."""
        if not self._before:
            return None
        if self._reordered_after_move:
            removed, added = self._diff()
            moved: list[MovedRequest] = []
        else:
            removed, added = self._frozen if self._frozen is not None else self._diff()
            moved = self._moved
        self._before = {}
        self._frozen = None
        self._moved = []
        self._reordered_after_move = False
        if not (removed or added or moved):
            return None  # e.g. a request added then removed again
        return BatchUpdate(batch_size=self.num_reqs, removed=removed, added=added, moved=moved)

    # ---- internals -----------------------------------------------------------------------

    def _lowest_hole(self) -> int | None:
        """The lowest hole row, dropping stale heap entries (trimmed or refilled rows)."""
        holes, n = self._holes, len(self._req_ids)
        while holes and (holes[0] >= n or self._req_ids[holes[0]] is not None):
            heapq.heappop(holes)
        return holes[0] if holes else None

    def _trim(self) -> None:
        """Drop trailing holes, so len(_req_ids) is one past the highest occupied row."""
        while self._req_ids and self._req_ids[-1] is None:
            self._req_ids.pop()
            self._slots.pop()

    def _touch(self, index: int) -> None:
        """Remember the row's occupant at the last update, the first time it changes."""
        if index not in self._before:
            self._before[index] = self._slots[index] if index < len(self._slots) else None

    def _note_add_or_remove(self) -> None:
        """An add or remove after a move: the update will be derived, not replayed."""
        if self._moved:
            self._reordered_after_move = True

    def _start_move(self, a: int, b: int) -> None:
        """Before rows a and b change by a move: remember their occupants, and at the update's
        first move freeze the adds/removes so far (the moves replay after them)."""
        if not self._moved and not self._reordered_after_move:
            self._frozen = self._diff()
        self._touch(a)
        self._touch(b)

    def _diff(self) -> tuple[list[int], list[AddedRequest]]:
        """removed/added turning the rows' occupants at the last update into the current ones:
        a row that lost its request is removed unless something else now lives there; a row
        whose occupant is not the one it had is added (re-using the request's add record)."""
        removed, added = [], []
        for index in sorted(self._before):
            before = self._before[index]
            now = self._slots[index] if index < len(self._slots) else None
            if now is before:
                continue
            if now is None:
                removed.append(index)
            else:
                added.append(now if now.index == index else now._replace(index=index))
        return removed, added
