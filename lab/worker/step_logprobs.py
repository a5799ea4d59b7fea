"""The logprobs a step returns beside its token ids: those of the sampled tokens (the rows that
asked) and those of the prompt positions computed this step (requests that asked for prompt
logprobs). The model runner calls these with its batch's rows; nothing here keeps state."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from lab.core.logprobs import LogprobsLists
from lab.core.sampling_params import SamplingParams
from lab.sampling.sampler import LogprobsTensors, compute_logprobs, gather_logprobs


class PromptState(Protocol):
    """What prompt logprobs read and advance of a request's state."""

    params: SamplingParams
    prompt_token_ids: list[int]
    prompt_logprobs_done: int  # prompt positions whose next-token logprobs were sent


def sampled_logprobs(req_ids: Sequence[str], rows: list[int], ks: list[int],
                     lp: LogprobsTensors) -> dict[str, LogprobsLists]:
    """Row i's entry (for i in `rows`, asking for ks top logprobs; -1: all), cut to the top-k it
    asked for (the batch computed the most any row asked)."""
    ids, values, ranks = (lp.token_ids[rows].tolist(), lp.logprobs[rows].tolist(),
                          lp.ranks[rows].tolist())
    result = {}
    for j, (i, k) in enumerate(zip(rows, ks)):
        width = len(ids[j]) if k < 0 else k + 1
        result[req_ids[i]] = LogprobsLists([ids[j][:width]], [values[j][:width]], [ranks[j]])
    return result


def prompt_logprobs(model: torch.nn.Module, state: PromptState, before: int, scheduled: int,
                    token_start: int, hidden: torch.Tensor) -> LogprobsLists | None:
    """The logprob of every prompt token after the first, from the position before it, for the
    prompt positions this step computed (each position once, even when a preempted request
    recomputes it); advances state.prompt_logprobs_done. None: nothing new, or a TP rank that
    took part in the compute_logits collective without getting logits.

        positions:  | computed before | this step (scheduled) | ...
                    0            before       before + scheduled
        logits of positions [first, last), last <= prompt_len - 1; hidden row of position p:
        token_start + p - before
    """
    first = max(before, state.prompt_logprobs_done)
    last = min(before + scheduled, len(state.prompt_token_ids) - 1)
    if first >= last:
        return None
    start = token_start + first - before
    logits = model.compute_logits(hidden[start : start + last - first])
    state.prompt_logprobs_done = last
    if logits is None:
        return None
    targets = torch.tensor(state.prompt_token_ids[first + 1 : last + 1], device=logits.device)
    lp = compute_logprobs(logits)
    k = state.params.prompt_logprobs
    k = lp.shape[-1] if k < 0 else min(k, lp.shape[-1])
    got = gather_logprobs(lp, k, targets)
    return LogprobsLists(got.token_ids.tolist(), got.logprobs.tolist(), got.ranks.tolist())
