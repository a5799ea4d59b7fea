"""Logprobs as they cross from the worker to the frontend: plain lists, no tensors.

One entry per scored position (a sampled token, or a prompt token after the first): the
position's own token first, then the top-k of the distribution (vLLM's LogprobsLists layout).
The top-k entries have ranks 1..k; the own token's rank is the number of tokens whose logprob is
at least its own (vLLM's count), so the argmax has rank 1.
Logprobs are *raw*: log_softmax of the model's logits before any logits processor, penalty or
temperature (vLLM's default `logprobs_mode="raw_logprobs"`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LogprobsLists:
    """Logprobs of consecutive positions of one request."""

    token_ids: list[list[int]] = field(default_factory=list)  # [own token, top-1 .. top-k]
    logprobs: list[list[float]] = field(default_factory=list)  # the same shape
    ranks: list[int] = field(default_factory=list)  # the own token's rank per position

    def __len__(self) -> int:
        return len(self.ranks)

    def extend(self, other: LogprobsLists) -> None:
        self.token_ids.extend(other.token_ids)
        self.logprobs.extend(other.logprobs)
        self.ranks.extend(other.ranks)
