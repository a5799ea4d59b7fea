"""Prompt-lookup drafts (`speculative=ngram`, vLLM's `ngram` method): no model, only the
request's own tokens.

For n from prompt_lookup_max down to prompt_lookup_min: if the request's last n tokens occurred
earlier in its context, the drafts are the (up to k) tokens that followed their most recent
earlier occurrence; the first n that matches wins (the longest match). No match: no drafts, the
request decodes one token this step.
"""

from __future__ import annotations

import numpy as np

from lab.speculative.base import ProposeInputs, Proposer, ProposerContext


def lookup(context: np.ndarray, n_min: int, n_max: int, k: int) -> list[int]:
    """The tokens after the most recent earlier occurrence of `context`'s longest suffix of
    n_min..n_max tokens (at most k); [] without one.

    The earlier positions holding the last token are the candidate ends of a match; each round
    keeps those whose match extends one token further back, so the survivors of the last round
    are the occurrences of the longest matching suffix (a few array operations per round,
    instead of comparing every window of the context for each n)."""
    length = len(context)
    ends = np.flatnonzero(context[: length - 1] == context[length - 1])
    matched = 1
    while ends.size and matched < n_max:
        back = ends - matched
        extends = back >= 0
        extends[extends] = context[back[extends]] == context[length - 1 - matched]
        if not extends.any():
            break
        ends, matched = ends[extends], matched + 1
    if not ends.size or matched < n_min:
        return []
    start = int(ends[-1]) + 1
    return context[start : start + k].tolist()


class NgramProposer(Proposer):
    """Drafts from the request's own context (module docstring)."""

    name = "ngram"

    def __init__(self, context: ProposerContext, num_speculative_tokens: int,
                 prompt_lookup_min: int = 2, prompt_lookup_max: int = 4) -> None:
        super().__init__(context, num_speculative_tokens)
        for field, value in (("prompt_lookup_min", prompt_lookup_min),
                             ("prompt_lookup_max", prompt_lookup_max)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"speculative.{field}={value!r} is invalid: use an integer >= 1 "
                                 "(tokens of the suffix looked up)")
        if prompt_lookup_min > prompt_lookup_max:
            raise ValueError(f"speculative.prompt_lookup_min={prompt_lookup_min} exceeds "
                             f"speculative.prompt_lookup_max={prompt_lookup_max}")
        self.n_min, self.n_max = prompt_lookup_min, prompt_lookup_max

    def propose(self, inputs: ProposeInputs) -> list[list[int]]:
        out = []
        for row, n, m in zip(inputs.rows.tolist(), inputs.num_tokens.tolist(),
                             inputs.max_drafts.tolist()):
            out.append(lookup(inputs.token_ids[row, :n], self.n_min, self.n_max, m) if m else [])
        return out
