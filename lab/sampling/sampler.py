"""Sampler: turns one step's logits into one token per row (vLLM V1's `Sampler.forward`).

Order: raw logprobs (if a row asks for them: log_softmax of the untouched logits, vLLM's
default "raw_logprobs") -> the logits processors that can change the argmax, in the configured
order (allowed_token_ids, bad_words, min_tokens, logit_bias, penalties by default) -> greedy
argmax (unless all rows are random; if all are greedy it is the answer) -> temperature ->
argmax-invariant processors -> min-p -> top-k -> top-p -> exponential-race sampling ->
where(greedy, ...) -> the logprobs of the sampled tokens and the top-k.
Every stage is vectorised over the batch; the only Python loop runs over seeded rows' generators.
Masked tokens get logit -inf, so their probability is exactly zero and they are never sampled.
The argmax (greedy rows, the exponential race) is the kernels option's (`LayerOps.argmax_rows`,
given by the model runner; the reference, `x.max(dim=-1).indices`, without one).

What a logits processor returns is checked (`apply_checked`): logits of another shape, dtype or
device, or NaN a processor put there, raise LogitsProcessorError naming the processor, so the
step fails its requests (finish reason error) instead of sampling token 0 from garbage.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from lab.kernels.cpu_argmax import argmax_rows_ref
from lab.logits_processors.base import LogitsProcessor
from lab.sampling.metadata import SamplingMetadata
from lab.sampling.rejection import PLACEHOLDER, draw_noise, empty_noise

_NEG_INF = float("-inf")


class LogitsProcessorError(RuntimeError):
    """A logits processor returned logits the sampler cannot use (see `apply_checked`)."""


def is_builtin(processor: LogitsProcessor) -> bool:
    """One of lab's own processors (lab.logits_processors.*, not a subclass elsewhere): they
    only add finite values or -inf to finite-or--inf logits, and their tests compare every row
    with a reference, so they cannot put NaN there."""
    return type(processor).__module__.startswith("lab.logits_processors.")


def apply_checked(processor: LogitsProcessor, logits: torch.Tensor,
                  check_nan: bool) -> torch.Tensor:
    """`processor.apply(logits)`, refused with LogitsProcessorError naming the processor's class
    unless it returns a tensor like `logits` (shape, dtype, device) and, with `check_nan`, puts
    no NaN in it (NaN the logits had before, the model's, are not the processor's doing).

    The shape / dtype / device checks read metadata only. The NaN check reads a flag back from
    the device, a sync in every step that would stall a GPU's queue: so only the processors that
    are not lab's own get it (`is_builtin`), whose output lab has not tested."""
    shape, dtype, device = logits.shape, logits.dtype, logits.device
    had_nan = torch.isnan(logits).any() if check_nan else None  # before an in-place apply
    out = processor.apply(logits)
    name = f"{type(processor).__module__}.{type(processor).__qualname__}"
    if not isinstance(out, torch.Tensor):
        raise LogitsProcessorError(f"logits processor {name}.apply returned "
                                   f"{type(out).__name__}, not the logits tensor")
    if (out.shape, out.dtype, out.device) != (shape, dtype, device):
        raise LogitsProcessorError(
            f"logits processor {name}.apply returned logits of shape {tuple(out.shape)}, "
            f"{out.dtype} on {out.device}; expected shape {tuple(shape)} (batch rows, vocab), "
            f"{dtype} on {device}")
    if check_nan and bool(torch.isnan(out).any() & ~had_nan):
        rows = torch.isnan(out).any(dim=-1).nonzero().flatten().tolist()
        raise LogitsProcessorError(f"logits processor {name}.apply returned NaN logits (batch "
                                   f"rows {rows})")
    return out


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


def random_sample(probs: torch.Tensor, generators: list[torch.Generator | None],
                  argmax: Callable[[torch.Tensor], torch.Tensor] = argmax_rows_ref
                  ) -> torch.Tensor:
    """The exponential race: argmax(probs / q), q ~ Exp(1), is an exact draw from `probs`."""
    q = exponential_noise(probs, generators)
    return argmax(probs / q)


@dataclass
class LogprobsTensors:
    """Per row: [own token, top-1 .. top-k] ids and logprobs, and the own token's rank."""

    token_ids: torch.Tensor  # int64 [B, k + 1]
    logprobs: torch.Tensor  # float32 [B, k + 1]
    ranks: torch.Tensor  # int64 [B]


@dataclass
class SamplerOutput:
    sampled: torch.Tensor  # int64 [B]
    logprobs: LogprobsTensors | None = None  # when a row asked for logprobs


def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1)


def gather_logprobs(logprobs: torch.Tensor, k: int, token_ids: torch.Tensor) -> LogprobsTensors:
    """The top-k of each row plus the logprob and rank of `token_ids` (vLLM's gather_logprobs:
    the own token first; its rank counts the tokens whose logprob is >= its own)."""
    own = logprobs.gather(-1, token_ids.long().unsqueeze(-1))
    ranks = (logprobs >= own).sum(dim=-1)
    top_values, top_ids = torch.topk(logprobs, k, dim=-1) if k > 0 else (
        logprobs[:, :0], torch.empty_like(logprobs[:, :0], dtype=torch.int64))
    return LogprobsTensors(torch.cat([token_ids.long().unsqueeze(-1), top_ids], dim=1),
                           torch.cat([own, top_values], dim=1), ranks)


@dataclass
class SpecSamplerOutput:
    """`tokens` int64 [B, max k + 1]: each request's emitted tokens, then PLACEHOLDER (-1);
    `logprobs`: one entry per emitted token, request by request in order."""

    tokens: torch.Tensor
    logprobs: LogprobsTensors | None = None


def emitted_rows(tokens: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """The logits row of every emitted token: request i's j-th token comes from row
    first[i] + j."""
    valid = tokens != PLACEHOLDER
    cols = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    return (first.unsqueeze(1) + cols)[valid]


class Sampler:
    """Samples one token id per row from float32 logits [B, V] under per-row SamplingMetadata,
    after the batch-level logits processors (their state is the model runner's business).
    `argmax`: the row argmax, the first index on ties, NaN largest (the kernels option's
    `argmax_rows`; default the reference)."""

    def __init__(self, processors: Sequence[LogitsProcessor] = (),
                 argmax: Callable[[torch.Tensor], torch.Tensor] = argmax_rows_ref) -> None:
        self.processors = list(processors)
        self.nan_checked = {id(p) for p in self.processors if not is_builtin(p)}
        self.argmax = argmax
        self.argmax_changing = [p for p in self.processors if not p.is_argmax_invariant()]
        self.argmax_invariant = [p for p in self.processors if p.is_argmax_invariant()]

    def __call__(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """The sampled token of each row (what `forward` samples, without logprobs)."""
        return self.forward(logits, meta).sampled

    def forward(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        raw = compute_logprobs(logits) if meta.max_num_logprobs is not None else None
        logits = self.apply_all(self.argmax_changing, logits.float())
        sampled = self.sample(logits, meta)
        if raw is None:
            return SamplerOutput(sampled)
        k = raw.shape[-1] if meta.max_num_logprobs < 0 else meta.max_num_logprobs
        return SamplerOutput(sampled, gather_logprobs(raw, min(k, raw.shape[-1]), sampled))

    def apply(self, processor: LogitsProcessor, logits: torch.Tensor) -> torch.Tensor:
        """One processor, its output checked (`apply_checked`)."""
        return apply_checked(processor, logits, id(processor) in self.nan_checked)

    def sample(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """Greedy rows take the argmax; random rows draw from the processed distribution."""
        if meta.all_greedy:
            return self.argmax(logits)
        sampled = random_sample(self.probs(logits, meta), meta.generators, self.argmax)
        if meta.all_random:
            return sampled
        return torch.where(meta.is_greedy, self.argmax(logits), sampled)

    def process_logits(self, logits: torch.Tensor, meta: SamplingMetadata,
                       processor_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Temperature, argmax-invariant processors, then min-p, top-k, top-p (skipping stages
        no row uses); masked = -inf. `processor_rows`: the rows the processors see (one per
        request, when a request has several rows: `verify`); None: all."""
        logits = apply_temperature(logits.float(), meta.temperature)
        logits = self.apply_all(self.argmax_invariant, logits, processor_rows)
        if not meta.no_min_p:
            logits = apply_min_p(logits, meta.min_p)
        if not meta.no_top_k:
            logits = apply_top_k(logits, meta.top_k)
        if not meta.no_top_p:
            logits = apply_top_p(logits, meta.top_p)
        return logits

    def probs(self, logits: torch.Tensor, meta: SamplingMetadata,
              processor_rows: torch.Tensor | None = None) -> torch.Tensor:
        """The distribution random rows sample from (greedy rows' values are unused)."""
        return torch.softmax(self.process_logits(logits, meta, processor_rows), dim=-1)

    def apply_all(self, processors: list[LogitsProcessor], logits: torch.Tensor,
                  rows: torch.Tensor | None = None) -> torch.Tensor:
        """Apply `processors` in order to `logits`, or only to its `rows` (one per request)."""
        if not processors:
            return logits
        sub = logits if rows is None else logits[rows]
        for processor in processors:
            sub = self.apply(processor, sub)
        return sub if rows is None else logits.index_copy(0, rows, sub)

    def verify(self, logits: torch.Tensor, meta: SamplingMetadata, num_draft_tokens: list[int],
               draft_token_ids: torch.Tensor, rejection: Callable[..., torch.Tensor],
               draft_probs: torch.Tensor | None = None) -> SpecSamplerOutput:
        """Speculative decoding's sampling step: the emitted tokens of each request from its
        k + 1 rows of `logits` (`num_draft_tokens[i]` = k; lab/sampling/rejection.py).

        As in vLLM the logits processors see one row per request, the first of its rows
        (requests they act on get no drafts: LogitsProcessor.speculates); temperature, min-p,
        top-k and top-p apply to every row; the raw logprobs are those of every row."""
        repeats = [k + 1 for k in num_draft_tokens]
        first = torch.tensor(list(itertools.accumulate(repeats, initial=0))[:-1],
                             dtype=torch.int64, device=logits.device)
        raw = compute_logprobs(logits) if meta.max_num_logprobs is not None else None
        logits = self.apply_all(self.argmax_changing, logits.float(), first)
        rows = meta.expand(repeats)
        if meta.all_greedy:
            target = logits
        else:
            probs = self.probs(logits, rows, first)
            target = probs if meta.all_random else torch.where(rows.is_greedy.unsqueeze(1),
                                                               logits, probs)
        noise = (empty_noise(logits) if meta.all_greedy else
                 draw_noise(num_draft_tokens, logits.shape[-1], meta.generators, logits.device))
        tokens = rejection(draft_token_ids, num_draft_tokens, target, draft_probs,
                           meta.is_greedy, noise)
        if raw is None:
            return SpecSamplerOutput(tokens)
        emitted = tokens[tokens != PLACEHOLDER]  # row by row: each request's rows in order
        rows_of = emitted_rows(tokens, first)
        k = raw.shape[-1] if meta.max_num_logprobs < 0 else meta.max_num_logprobs
        return SpecSamplerOutput(tokens, gather_logprobs(raw[rows_of], min(k, raw.shape[-1]),
                                                         emitted))
