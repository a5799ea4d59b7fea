"""logit_bias: add each request's per-token bias to its row (vLLM's LogitBiasLogitsProcessor)."""

from __future__ import annotations

import torch

from lab.logits_processors._rows import RowStateLogitsProcessor, widen
from lab.logits_processors.base import AddedRequest


class LogitBiasLogitsProcessor(RowStateLogitsProcessor):
    """logits[row, token] += bias for every (token, bias) in the row's `logit_bias`.

    State: each row's biased tokens and biases, padded to the widest request seen (padding:
    token 0 with bias 0.0, which adds nothing); one scatter_add over the batch per step."""

    implements = ("logit_bias",)

    def uses(self, added: AddedRequest) -> bool:
        """A request with a non-empty logit_bias."""
        return bool(added.params.logit_bias)

    def _allocate(self) -> None:
        """One (token 0, bias 0.0) column to start; widened by the widest request."""
        self.tokens = self._zeros(1, dtype=torch.long)
        self.biases = self._zeros(1, dtype=torch.float32)

    def _row_tensors(self) -> list[tuple[torch.Tensor, object]]:
        """Biased tokens (neutral 0) and biases (neutral 0.0)."""
        return [(self.tokens, 0), (self.biases, 0.0)]

    def _set_row(self, added: AddedRequest) -> None:
        """The row's (token, bias) pairs, padded with (0, 0.0)."""
        bias = added.params.logit_bias
        width = len(bias)
        self.tokens = widen(self.tokens, 1, width, 0)
        self.biases = widen(self.biases, 1, width, 0.0)
        row = added.index
        self.tokens[row] = 0
        self.biases[row] = 0.0
        self.tokens[row, :width] = self._tensor(list(bias), torch.long)
        self.biases[row, :width] = self._tensor(list(bias.values()), torch.float32)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Add the biases of every row at once (rows without logit_bias add 0.0)."""
        if not self.active:
            return logits
        n = logits.shape[0]
        return logits.scatter_add_(1, self.tokens[:n], self.biases[:n])
