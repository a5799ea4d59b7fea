"""Sampler: turns one step's logits into one token per row (vLLM V1's `Sampler.sample`).

Order: greedy argmax (unless all rows are random; if all are greedy it is the answer) ->
temperature -> min-p -> top-k -> top-p -> exponential-race sampling -> where(greedy, ...).
Every stage is vectorised over the batch; the only Python loop runs over seeded rows' generators.
Masked tokens get logit -inf, so their probability is exactly zero and they are never sampled.
"""

from __future__ import annotations

import torch

from lab.sampling.metadata import SamplingMetadata

_NEG_INF = float("-inf")


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """logits / T per row (returns a new tensor; greedy rows carry T = 1)."""
    return logits / temperature.unsqueeze(1)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens whose probability is below min_p times the row's largest probability."""
    probs = torch.softmax(logits, dim=-1)
    threshold = min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < threshold, _NEG_INF)


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Keep each row's k largest logits (ties with the k-th are kept); k = 0 means off."""
    vocab = logits.shape[-1]
    k = torch.where(top_k <= 0, vocab, top_k).clamp(max=vocab)
    top_values = torch.topk(logits, int(k.max()), dim=-1).values
    threshold = top_values.gather(1, (k - 1).unsqueeze(1))
    return logits.masked_fill(logits < threshold, _NEG_INF)


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of most-probable tokens whose mass reaches top_p (always >= 1 token).

    Sort ascending; a token is masked when the mass at or below it is <= 1 - p, i.e. when the
    tokens above it already hold >= p. The largest token is always kept.
    """
    sorted_logits, order = logits.sort(dim=-1)
    cum_probs = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    mask_sorted = cum_probs <= (1.0 - top_p).unsqueeze(1)
    mask_sorted[:, -1] = False
    mask_sorted &= (top_p < 1.0).unsqueeze(1)  # p = 1 is off, even for underflowed tokens
    mask = torch.empty_like(mask_sorted).scatter_(1, order, mask_sorted)
    return logits.masked_fill(mask, _NEG_INF)


def exponential_noise(
    like: torch.Tensor, generators: list[torch.Generator | None]
) -> torch.Tensor:
    """q ~ Exp(1) shaped like `like`; seeded rows draw their row from their own generator.

    Unseeded rows share one draw from the global RNG (skipped when every row is seeded), so a
    seeded row's noise depends only on its generator, never on the rest of the batch.
    """
    q = torch.empty_like(like)
    seeded = [(i, g) for i, g in enumerate(generators) if g is not None]
    if len(seeded) < like.shape[0]:
        q.exponential_()
    for row, gen in seeded:
        q[row].exponential_(generator=gen)
    # Exp(1) can in principle return exactly 0; 0/0 would make argmax pick a masked token.
    return q.clamp_(min=torch.finfo(q.dtype).tiny)


def random_sample(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """The exponential race: argmax(probs / q), q ~ Exp(1), is an exact draw from `probs`."""
    q = exponential_noise(probs, generators)
    return (probs / q).argmax(dim=-1)


class Sampler:
    """Samples one token id per row from float32 logits [B, V] under per-row SamplingMetadata."""

    def __call__(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        if meta.all_greedy:
            return logits.argmax(dim=-1)
        sampled = random_sample(self.probs(logits, meta), meta.generators)
        if meta.all_random:
            return sampled
        return torch.where(meta.is_greedy, logits.argmax(dim=-1), sampled)

    @staticmethod
    def process_logits(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """Temperature then min-p, top-k, top-p (skipping stages no row uses); masked = -inf."""
        logits = apply_temperature(logits.float(), meta.temperature)
        if not meta.no_min_p:
            logits = apply_min_p(logits, meta.min_p)
        if not meta.no_top_k:
            logits = apply_top_k(logits, meta.top_k)
        if not meta.no_top_p:
            logits = apply_top_p(logits, meta.top_p)
        return logits

    @classmethod
    def probs(cls, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """The distribution random rows sample from (greedy rows' values are unused)."""
        return torch.softmax(cls.process_logits(logits, meta), dim=-1)
