"""allowed_token_ids: a request may only sample from its allowed tokens (vLLM's InputBatch
allowed_token_ids mask)."""

from __future__ import annotations

import torch

from lab.logits_processors._rows import RowStateLogitsProcessor
from lab.logits_processors.base import AddedRequest


class AllowedTokenIdsLogitsProcessor(RowStateLogitsProcessor):
    """Tokens outside a row's `allowed_token_ids` get -inf; rows without it are untouched.

    State: a [max_num_reqs, vocab] bool mask of banned tokens (all False in rows that do not
    restrict), as vLLM keeps it; one masked_fill over the batch per step."""

    implements = ("allowed_token_ids",)

    def uses(self, added: AddedRequest) -> bool:
        """A request that restricts its tokens."""
        return added.params.allowed_token_ids is not None

    def _allocate(self) -> None:
        """The [max_num_reqs, vocab] banned-token mask, all False."""
        self.banned = self._zeros(self.context.vocab_size, dtype=torch.bool)

    def _row_tensors(self) -> list[tuple[torch.Tensor, object]]:
        """The banned-token mask (neutral: nothing banned)."""
        return [(self.banned, False)]

    def _set_row(self, added: AddedRequest) -> None:
        """Ban every token, then un-ban the allowed ones."""
        row = added.index
        self.banned[row] = True
        self.banned[row, self._tensor(list(added.params.allowed_token_ids), torch.long)] = False

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """-inf wherever a row's mask bans the token."""
        if not self.active:
            return logits
        return logits.masked_fill_(self.banned[:logits.shape[0]], float("-inf"))
