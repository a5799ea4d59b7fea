"""bad_words: a request never completes one of its bad words (vLLM's apply_bad_words)."""

from __future__ import annotations

import torch

from lab.logits_processors._rows import RowStateLogitsProcessor, widen
from lab.logits_processors.base import AddedRequest


class BadWordsLogitsProcessor(RowStateLogitsProcessor):
    """For each bad word w (token ids, from `bad_words_token_ids`) of a row: if the row's last
    len(w)-1 OUTPUT tokens are w[:-1] (always, for a 1-token word), logits[row, w[-1]] = -inf.
    A row with fewer than len(w)-1 output tokens cannot match w.

    State, padded to the most words (W) and the longest prefix (P) seen:
    `last` [R, W] each word's banned token; `plen` [R, W] its prefix length (-1: no word);
    `prefix` [R, W, P] the prefix right-aligned; `history` [R, P] the row's last P output
    tokens right-aligned (kept up to date in `on_sampled`), -1 before its first token, so a
    row with fewer output tokens than a prefix cannot match it (tokens are >= 0). `apply`
    compares all (row, word) pairs at once and bans with one scatter_reduce(amin) of
    -inf/+inf."""

    implements = ("bad_words", "bad_words_token_ids")

    def uses(self, added: AddedRequest) -> bool:
        """A request with bad words (as token ids)."""
        return bool(added.params.bad_words_token_ids)

    def _allocate(self) -> None:
        """One empty word slot and zero-width prefixes/history to start."""
        self.last = self._zeros(1, dtype=torch.long)
        self.plen = self._zeros(1, dtype=torch.long, fill=-1)
        self.prefix = self._zeros(1, 0, dtype=torch.long, fill=-1)
        self.history = self._zeros(0, dtype=torch.long, fill=-1)

    def _row_tensors(self) -> list[tuple[torch.Tensor, object]]:
        """Words' last tokens, prefix lengths (neutral -1: no word), prefixes, history."""
        return [(self.last, 0), (self.plen, -1), (self.prefix, -1), (self.history, -1)]

    def _set_row(self, added: AddedRequest) -> None:
        """The row's words (right-aligned prefixes) and the tail of its output so far."""
        words = added.params.bad_words_token_ids
        num_words, width = len(words), max(len(w) for w in words) - 1
        self.last = widen(self.last, 1, num_words, 0)
        self.plen = widen(self.plen, 1, num_words, -1)
        self.prefix = widen(widen(self.prefix, 1, num_words, -1), 2, width, -1, left=True)
        self.history = widen(self.history, 1, width, -1, left=True)
        w_max, p_max = self.prefix.shape[1:]
        last, plen = [0] * w_max, [-1] * w_max
        prefix = [[-1] * p_max for _ in range(w_max)]
        for k, word in enumerate(words):
            last[k], plen[k] = word[-1], len(word) - 1
            prefix[k][p_max - plen[k]:] = word[:-1]
        output = added.output_token_ids
        tail = list(output[max(0, len(output) - p_max):]) if p_max else []
        row = added.index
        self.last[row] = self._tensor(last, torch.long)
        self.plen[row] = self._tensor(plen, torch.long)
        self.prefix[row] = self._tensor(prefix, torch.long)
        self.history[row] = self._tensor([-1] * (p_max - len(tail)) + tail, torch.long)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """-inf at the last token of every bad word whose prefix the row just generated."""
        if not self.active:
            return logits
        n = logits.shape[0]
        plen, p_max = self.plen[:n], self.prefix.shape[2]
        # position j of the right-aligned prefix is part of the word iff j >= P - plen
        in_word = torch.arange(p_max, device=logits.device) >= (p_max - plen)[..., None]
        same = (self.prefix[:n] == self.history[:n, None, :]) | ~in_word
        match = same.all(dim=2) & (plen >= 0)
        fill = torch.where(match, float("-inf"), float("inf")).to(logits.dtype)
        return logits.scatter_reduce_(1, self.last[:n], fill, reduce="amin")

    def on_sampled(self, token_ids: torch.Tensor) -> None:
        """Shift each row's sampled token into its history (rows with -1 keep theirs)."""
        if not self.active:
            return
        if self.history.shape[1]:
            history = self.history[:token_ids.shape[0]]
            shifted = torch.cat([history[:, 1:], token_ids[:, None]], dim=1)
            history.copy_(torch.where((token_ids >= 0)[:, None], shifted, history))
