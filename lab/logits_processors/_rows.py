"""RowStateLogitsProcessor: the BatchUpdate bookkeeping the built-in processors share.

A built-in keeps its per-request state in tensors whose dim 0 is the batch row (max_num_reqs
rows, allocated when the first request that uses the processor arrives) and applies it to all
rows at once. Rows whose request does not use the processor hold *neutral* parameters (a bias of
0, a penalty of 1, no banned token, ...), so `apply` can run the same tensor ops over every row
without a mask; the Python set `active` (rows that use it) only says whether to run at all.
Following a BatchUpdate costs Python work per entry (a removed/added/moved row), never per row.
"""

from __future__ import annotations

from abc import abstractmethod

import torch

from lab.core.sampling_params import SamplingParams
from lab.logits_processors.base import (
    AddedRequest,
    BatchUpdate,
    LogitsProcessor,
    LogitsProcessorContext,
    MoveDirectionality,
)


class RowStateLogitsProcessor(LogitsProcessor):
    """A LogitsProcessor whose state is row-indexed tensors; subclasses say which rows use it
    (`uses`), what the tensors are (`_allocate`, `_row_tensors`) and how an added request
    fills its row (`_set_row`)."""

    def __init__(self, context: LogitsProcessorContext) -> None:
        """No state tensors yet: they come with the first request that uses the processor."""
        super().__init__(context)
        self.device = torch.device(context.device)
        self.active: set[int] = set()  # rows whose request uses the processor
        self.allocated = False

    def is_argmax_invariant(self) -> bool:
        """The built-ins mask, bias or penalize tokens: each can change a row's argmax."""
        return False

    @abstractmethod
    def uses(self, added: AddedRequest) -> bool:
        """Whether this request needs the processor (else its row stays neutral)."""

    @abstractmethod
    def _allocate(self) -> None:
        """Create the state tensors, neutral in every row."""

    @abstractmethod
    def _row_tensors(self) -> list[tuple[torch.Tensor, object]]:
        """The state tensors (dim 0: batch row) with each one's neutral fill value."""

    @abstractmethod
    def _set_row(self, added: AddedRequest) -> None:
        """Write an added request's state into row `added.index` (growing widths if needed)."""

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Follow the batch: removed rows go neutral, added rows are written, moves move rows."""
        if batch_update is None:
            return
        for index in batch_update.removed:
            if index in self.active:
                self._clear(index)
        for added in batch_update.added:
            if self.uses(added):
                if not self.allocated:
                    self._allocate()
                    self.allocated = True
                self._set_row(added)
                self.active.add(added.index)
            elif added.index in self.active:
                self._clear(added.index)
        for src, dst, direction in batch_update.moved:
            src_on, dst_on = src in self.active, dst in self.active
            if not (src_on or dst_on):
                continue  # both rows neutral: nothing to move
            if direction is MoveDirectionality.SWAP:
                for tensor, _ in self._row_tensors():
                    tensor[[src, dst]] = tensor[[dst, src]]
                if src_on != dst_on:
                    self.active.symmetric_difference_update((src, dst))
            else:
                for tensor, _ in self._row_tensors():
                    tensor[dst] = tensor[src]
                if src_on:
                    self._clear(src)
                    self.active.add(dst)
                else:
                    self.active.discard(dst)

    def _clear(self, index: int) -> None:
        """Make a row neutral and inactive."""
        self.active.discard(index)
        for tensor, neutral in self._row_tensors():
            tensor[index] = neutral

    def _zeros(self, *shape: int, dtype: torch.dtype, fill: object = 0) -> torch.Tensor:
        """A state tensor of max_num_reqs rows filled with `fill` on the processor's device."""
        return torch.full((self.context.max_num_reqs, *shape), fill, dtype=dtype,
                          device=self.device)

    def _tensor(self, data: list, dtype: torch.dtype) -> torch.Tensor:
        """Host data for one row, on the device."""
        return torch.tensor(data, dtype=dtype).to(self.device, non_blocking=True)


def widen(tensor: torch.Tensor, dim: int, size: int, fill: object, left: bool = False
          ) -> torch.Tensor:
    """`tensor` grown along `dim` to at least `size`, new entries `fill` (on the left if
    `left`: right-aligned data keeps its alignment); the tensor itself if already that wide."""
    if tensor.shape[dim] >= size:
        return tensor
    shape = list(tensor.shape)
    pad_shape = shape.copy()
    pad_shape[dim] = size - shape[dim]
    pad = torch.full(pad_shape, fill, dtype=tensor.dtype, device=tensor.device)
    return torch.cat([pad, tensor] if left else [tensor, pad], dim=dim)


def stop_token_ids(params: SamplingParams, eos_token_ids: tuple[int, ...]) -> list[int]:
    """What min_tokens masks: the model's EOS (even with ignore_eos, as vLLM) and the request's
    stop tokens, deduplicated in order."""
    return list(dict.fromkeys((*eos_token_ids, *params.stop_token_ids)))
