"""A plug-in's per-request arguments, two ways: `SamplingParams.extra_args` (vLLM's free-form
dict) and a SamplingParams subclass with a field of its own. One logits processor reads both:
it bans a token per request (`extra_args["ban_token_id"]`, or `BanParams.ban_token_id`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lab.core.sampling_params import SamplingParams
from lab.logits_processors.base import BatchUpdate, LogitsProcessor, LogitsProcessorContext


@dataclass(frozen=True)
class BanParams(SamplingParams):
    """SamplingParams with the plug-in's own field (crosses to an engine-core process as
    itself: lab.engine.serial rebuilds it there)."""

    ban_token_id: int | None = None


def banned_token(params: SamplingParams) -> int:
    """The token a request bans (-1: none): its own field, else extra_args["ban_token_id"]."""
    token = getattr(params, "ban_token_id", None)
    if token is None and params.extra_args:
        token = params.extra_args.get("ban_token_id")
    return -1 if token is None else int(token)


class BanTokenFromArgs(LogitsProcessor):
    """Gives -inf to each row's banned token (state: one token id per batch row, -1 none)."""

    def __init__(self, context: LogitsProcessorContext) -> None:
        super().__init__(context)
        self.banned = torch.full((context.max_num_reqs,), -1, dtype=torch.long,
                                 device=context.device)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.banned[index] = -1
        for added in batch_update.added:
            self.banned[added.index] = banned_token(added.params)
        for move in batch_update.moved:
            a, b = self.banned[move.src].clone(), self.banned[move.dst].clone()
            self.banned[move.dst] = a
            self.banned[move.src] = b if move.direction.name == "SWAP" else -1

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        banned = self.banned[: logits.shape[0]]
        rows = (banned >= 0).nonzero().squeeze(1)
        logits[rows, banned[rows]] = float("-inf")
        return logits
