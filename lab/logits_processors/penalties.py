"""penalties: repetition, frequency and presence penalties (vLLM's apply_penalties)."""

from __future__ import annotations

import torch

from lab.logits_processors._rows import RowStateLogitsProcessor
from lab.logits_processors.base import AddedRequest

_F32_MAX = torch.finfo(torch.float32).max  # the largest repetition penalty a row holds


class PenaltiesLogitsProcessor(RowStateLogitsProcessor):
    """vLLM's order, per row: repetition penalty r on tokens in prompt ∪ output (a logit > 0 is
    divided by r, others multiplied), then logit -= frequency_penalty * (count of the token in
    the OUTPUT), then logit -= presence_penalty * (the token is in the output).

    State: per-row penalties (neutral 1, 0, 0 for rows without any), a [R, vocab] bool mask of
    the prompt's tokens (set on add) and [R, vocab] int32 output counts (counted from the live
    list on add, then one index_put per step in `on_sampled`). Counts of neutral rows may be
    stale: their penalties make them no-ops."""

    implements = ("repetition_penalty", "frequency_penalty", "presence_penalty")

    def uses(self, added: AddedRequest) -> bool:
        """A request with any penalty that is not a no-op."""
        p = added.params
        return (p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0
                or p.presence_penalty != 0.0)

    def _allocate(self) -> None:
        """Neutral penalties, an empty prompt mask and zero counts in every row."""
        vocab = self.context.vocab_size
        self.repetition = self._zeros(dtype=torch.float32, fill=1.0)
        self.frequency = self._zeros(dtype=torch.float32)
        self.presence = self._zeros(dtype=torch.float32)
        self.in_prompt = self._zeros(vocab, dtype=torch.bool)
        self.counts = self._zeros(vocab, dtype=torch.int32)
        self.rows = torch.arange(self.context.max_num_reqs, device=self.device)

    def _row_tensors(self) -> list[tuple[torch.Tensor, object]]:
        """The penalties (neutral 1, 0, 0), the prompt mask and the output counts."""
        return [(self.repetition, 1.0), (self.frequency, 0.0), (self.presence, 0.0),
                (self.in_prompt, False), (self.counts, 0)]

    def _set_row(self, added: AddedRequest) -> None:
        """The row's penalties, prompt tokens and the counts of the output it has so far."""
        row, p = added.index, added.params
        # any finite r > 0 is valid; beyond float32 it would not store (and r = inf makes
        # 0 * r NaN): the float32 maximum divides and multiplies the same
        self.repetition[row] = min(p.repetition_penalty, _F32_MAX)
        self.frequency[row] = p.frequency_penalty
        self.presence[row] = p.presence_penalty
        self.in_prompt[row] = False
        if added.prompt_token_ids:
            self.in_prompt[row, self._tensor(list(added.prompt_token_ids), torch.long)] = True
        self.counts[row] = 0
        if added.output_token_ids:
            output = self._tensor(list(added.output_token_ids), torch.long)
            self.counts[row].index_add_(0, output, torch.ones_like(output, dtype=torch.int32))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """All three penalties on every row at once (neutral rows come out unchanged)."""
        if not self.active:
            return logits
        n = logits.shape[0]
        counts = self.counts[:n]
        in_output = counts > 0
        r = self.repetition[:n, None]
        penalized = torch.where(logits > 0, logits / r, logits * r)
        logits.copy_(torch.where(self.in_prompt[:n] | in_output, penalized, logits))
        logits -= self.frequency[:n, None] * counts
        logits -= self.presence[:n, None] * in_output
        return logits

    def on_sampled(self, token_ids: torch.Tensor) -> None:
        """Count each row's sampled token (rows with -1 add 0 at token 0)."""
        if not self.active:
            return
        n = token_ids.shape[0]
        self.counts.index_put_((self.rows[:n], token_ids.clamp(min=0)),
                               (token_ids >= 0).to(torch.int32), accumulate=True)
