"""A user's logits processor as the README describes it: one class (this file) plus one YAML
(`_target_: tests.sampling.example_processor.BanTokenForSeededRequests`, `_partial_: true`) —
here given as a config override by the test instead of a file in lab/conf/logits_processors/."""

from __future__ import annotations

import torch

from lab.logits_processors.base import BatchUpdate, LogitsProcessor, LogitsProcessorContext


class BanTokenForSeededRequests(LogitsProcessor):
    """Bans `token` for every request that has a seed (state: one bool per batch row)."""

    def __init__(self, context: LogitsProcessorContext, token: int) -> None:
        super().__init__(context)
        self.token = token
        self.banned = torch.zeros(context.max_num_reqs, dtype=torch.bool, device=context.device)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.banned[index] = False
        for added in batch_update.added:
            self.banned[added.index] = added.params.seed is not None
        for move in batch_update.moved:
            a, b = self.banned[move.src].clone(), self.banned[move.dst].clone()
            self.banned[move.dst] = a
            self.banned[move.src] = b if move.direction.name == "SWAP" else False

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        rows = self.banned[: logits.shape[0]]
        logits[:, self.token] = logits[:, self.token].masked_fill(rows, float("-inf"))
        return logits
