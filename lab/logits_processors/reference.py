"""Per-request reference implementations of the built-in processors, for the tests.

Each is `fn(logits_row [vocab], params, prompt_token_ids, output_token_ids, eos_token_ids)
-> logits_row` (a new tensor), written token by token from vLLM's definitions, so that it is
obviously right; the batched processors must reproduce them exactly (float32 arithmetic done
in the same order)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from lab.core.sampling_params import SamplingParams

NEG_INF = float("-inf")


def allowed_token_ids(row: torch.Tensor, params: SamplingParams, prompt: Sequence[int] | None,
                      output: Sequence[int], eos: Sequence[int]) -> torch.Tensor:
    """Every token not in allowed_token_ids -> -inf."""
    row = row.clone()
    if params.allowed_token_ids is not None:
        allowed = set(params.allowed_token_ids)
        for token in range(row.shape[0]):
            if token not in allowed:
                row[token] = NEG_INF
    return row


def bad_words(row: torch.Tensor, params: SamplingParams, prompt: Sequence[int] | None,
              output: Sequence[int], eos: Sequence[int]) -> torch.Tensor:
    """A bad word's last token -> -inf when the output ends with the word's other tokens."""
    row = row.clone()
    for word in params.bad_words_token_ids or ():
        prefix = list(word[:-1])
        if len(output) >= len(prefix) and list(output[len(output) - len(prefix):]) == prefix:
            row[word[-1]] = NEG_INF
    return row


def min_tokens(row: torch.Tensor, params: SamplingParams, prompt: Sequence[int] | None,
               output: Sequence[int], eos: Sequence[int]) -> torch.Tensor:
    """EOS and stop tokens -> -inf while the output is shorter than min_tokens."""
    row = row.clone()
    if len(output) < params.min_tokens:
        for token in set(eos) | set(params.stop_token_ids):
            row[token] = NEG_INF
    return row


def logit_bias(row: torch.Tensor, params: SamplingParams, prompt: Sequence[int] | None,
               output: Sequence[int], eos: Sequence[int]) -> torch.Tensor:
    """row[token] += bias (the bias as float32)."""
    row = row.clone()
    for token, bias in (params.logit_bias or {}).items():
        row[token] = row[token] + torch.tensor(bias, dtype=torch.float32)
    return row


def penalties(row: torch.Tensor, params: SamplingParams, prompt: Sequence[int] | None,
              output: Sequence[int], eos: Sequence[int]) -> torch.Tensor:
    """Repetition (prompt ∪ output: divide a positive logit, multiply the others), then
    frequency (output count), then presence (in the output), token by token."""
    row = row.clone()
    f32 = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    r = f32(min(params.repetition_penalty, torch.finfo(torch.float32).max))  # as the row holds
    freq, pres = f32(params.frequency_penalty), f32(params.presence_penalty)
    counts = Counter(output)
    for token in set(prompt or ()) | set(counts):
        row[token] = row[token] / r if row[token] > 0 else row[token] * r
    for token, count in counts.items():
        row[token] = row[token] - freq * f32(count)
        row[token] = row[token] - pres
    return row


REFERENCES = {
    "allowed_token_ids": allowed_token_ids,
    "bad_words": bad_words,
    "min_tokens": min_tokens,
    "logit_bias": logit_bias,
    "penalties": penalties,
}


def apply_reference(names: Sequence[str], row: torch.Tensor, params: SamplingParams,
                    prompt: Sequence[int] | None, output: Sequence[int],
                    eos: Sequence[int]) -> torch.Tensor:
    """The named references chained in the given order."""
    for name in names:
        row = REFERENCES[name](row, params, prompt, output, eos)
    return row
