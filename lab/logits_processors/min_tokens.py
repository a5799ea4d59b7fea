"""min_tokens: a request cannot stop before it generated min_tokens tokens (vLLM's
MinTokensLogitsProcessor)."""

from __future__ import annotations

import torch

from lab.logits_processors._rows import RowStateLogitsProcessor, stop_token_ids
from lab.logits_processors.base import AddedRequest


class MinTokensLogitsProcessor(RowStateLogitsProcessor):
    """While a row has fewer than `min_tokens` output tokens, its stop tokens (the model's EOS,
    even with ignore_eos, and `stop_token_ids`) get -inf.

    State: each row's tokens still to generate (decremented on the device in `on_sampled`,
    so no host sync) and its stop tokens, padded with repeats of its first one. `apply` is one
    scatter_reduce(amin) of -inf (row still short) or +inf (no-op) over the batch."""

    implements = ("min_tokens",)

    def uses(self, added: AddedRequest) -> bool:
        """A request with min_tokens still ahead of its output and some stop token to mask."""
        return (added.params.min_tokens > len(added.output_token_ids)
                and bool(stop_token_ids(added.params, self.context.eos_token_ids)))

    def _allocate(self) -> None:
        """Tokens still owed (0: neutral) and stop tokens, one column to start."""
        self.remaining = self._zeros(dtype=torch.long)
        self.stops = self._zeros(1, dtype=torch.long)

    def _row_tensors(self) -> list[tuple[torch.Tensor, object]]:
        """remaining (neutral 0) and the stop tokens."""
        return [(self.remaining, 0), (self.stops, 0)]

    def _set_row(self, added: AddedRequest) -> None:
        """The row's stop tokens (padded with its first) and how many tokens it still owes."""
        stops = stop_token_ids(added.params, self.context.eos_token_ids)
        if len(stops) > self.stops.shape[1]:  # other rows pad with their first stop token too
            extra = len(stops) - self.stops.shape[1]
            self.stops = torch.cat([self.stops, self.stops[:, :1].expand(-1, extra)], dim=1)
        padded = stops + [stops[0]] * (self.stops.shape[1] - len(stops))
        self.stops[added.index] = self._tensor(padded, torch.long)
        self.remaining[added.index] = added.params.min_tokens - len(added.output_token_ids)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """-inf on the stop tokens of rows that still owe tokens."""
        if not self.active:
            return logits
        n = logits.shape[0]
        stops = self.stops[:n]
        fill = torch.where(self.remaining[:n] > 0, float("-inf"), float("inf"))
        return logits.scatter_reduce_(1, stops, fill.to(logits.dtype)[:, None].expand_as(stops),
                                      reduce="amin")

    def on_sampled(self, token_ids: torch.Tensor) -> None:
        """One token fewer to go for every row that appended one."""
        if not self.active:
            return
        remaining = self.remaining[:token_ids.shape[0]]
        remaining -= ((token_ids >= 0) & (remaining > 0)).long()
