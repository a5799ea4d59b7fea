"""A logits processor (the `logits_processors` group; base class
lab.logits_processors.base.LogitsProcessor) reading per-request `SamplingParams.extra_args`.

    SamplingParams(extra_args={"banned_token_ids": [5, 9]})   # never sample 5 or 9

List it with the built-ins: `logits_processors=[allowed_token_ids,bad_words,min_tokens,
logit_bias,penalties,banned_tokens]` (listing replaces the default list).
"""

from __future__ import annotations

import torch

from lab.logits_processors.base import (
    AddedRequest,
    BatchUpdate,
    LogitsProcessor,
    LogitsProcessorContext,
    follow_rows,
)


def banned_ids(added: AddedRequest) -> list[int] | None:
    """A request's extra_args["banned_token_ids"] (None when it bans nothing)."""
    return list((added.params.extra_args or {}).get("banned_token_ids") or []) or None


class BannedTokens(LogitsProcessor):
    """-inf at each request's `extra_args["banned_token_ids"]` (rows without it: untouched)."""

    def __init__(self, context: LogitsProcessorContext) -> None:
        super().__init__(context)
        self.banned: dict[int, list[int]] = {}  # batch row -> banned ids

    @classmethod
    def validate_params(cls, params) -> None:
        ids = (params.extra_args or {}).get("banned_token_ids", [])
        if not isinstance(ids, list) or not all(isinstance(i, int) and i >= 0 for i in ids):
            raise ValueError(f"extra_args['banned_token_ids']={ids!r} must be a list of token "
                             "ids >= 0")

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        follow_rows(self.banned, batch_update, banned_ids)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, ids in self.banned.items():
            if row < logits.shape[0]:
                logits[row, [i for i in ids if i < logits.shape[1]]] = float("-inf")
        return logits
