"""SyntheticWorkload: random prompts of chosen lengths, arrival process and prefix sharing.

With `num_prefix_groups = G > 0`, request i belongs to group i % G and its prompt is

    | group prefix (prefix_len tokens, shared) | own suffix (prompt_len - prefix_len) |

The first suffix token differs between the members of a group and the first prefix token differs
between groups (when the vocabulary allows), so members share exactly `prefix_len` tokens.
Lengths, token ids, arrivals and priorities draw from independent streams of one seed: changing
the arrival process leaves the prompts unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lab.core.sampling_params import SamplingParams
from lab.workloads.base import Workload, WorkloadRequest
from lab.workloads.distributions import (
    LengthDist,
    TokenSampler,
    arrival_times,
    check_int,
    validate_arrival,
)

DEFAULT_NUM_REQUESTS = 64
INTERPRETER_NUM_REQUESTS = 32  # the design card's command finishes in minutes on a 2-core CPU


class SyntheticWorkload(Workload):
    """Random requests; every knob is a plain (Hydra-overridable) argument."""

    def __init__(
        self,
        num_requests: int | None = 64,
        prompt_len: Any = None,
        output_len: Any = None,
        arrival: str = "batch",
        rate: float | None = None,
        burstiness: float = 1.0,
        num_prefix_groups: int = 0,
        prefix_len: int = 0,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        ignore_eos: bool = True,
        num_priorities: int = 1,
        num_clients: int = 0,
        low_token_id: int = 3,
        seed: int = 0,
    ) -> None:
        if num_requests is not None:
            check_int("num_requests", num_requests, 1)
        self.num_requests = num_requests  # None: default_num_requests(interpreted)
        self.prompt_len = LengthDist.parse(
            {"min": 16, "max": 128} if prompt_len is None else prompt_len, "prompt_len")
        self.output_len = LengthDist.parse(
            {"min": 16, "max": 64} if output_len is None else output_len, "output_len")
        validate_arrival(arrival, rate, burstiness)
        self.arrival, self.rate, self.burstiness = arrival, rate, burstiness
        self._init_prefix(num_prefix_groups, prefix_len)
        for name, value, low in [("num_priorities", num_priorities, 1),
                                 ("num_clients", num_clients, 0),
                                 ("low_token_id", low_token_id, 0), ("seed", seed, 0)]:
            check_int(name, value, low)
        self.num_priorities, self.num_clients = num_priorities, num_clients
        self.low_token_id, self.seed = low_token_id, seed
        self.sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k,
                         "ignore_eos": ignore_eos}
        SamplingParams(**self.sampling, max_tokens=self.output_len.max)  # validates early

    def _init_prefix(self, num_prefix_groups: int, prefix_len: int) -> None:
        check_int("num_prefix_groups", num_prefix_groups, 0)
        check_int("prefix_len", prefix_len, 1 if num_prefix_groups else 0)
        if num_prefix_groups and prefix_len >= self.prompt_len.min:
            raise ValueError(
                f"prefix_len={prefix_len} must be < prompt_len.min={self.prompt_len.min} "
                "so every prompt has its own suffix"
            )
        self.num_prefix_groups, self.prefix_len = num_prefix_groups, prefix_len

    def requests(
        self, vocab_size: int, eos_token_id: int | None, interpreted: bool = False
    ) -> list[WorkloadRequest]:
        tokens = TokenSampler(vocab_size, eos_token_id, self.low_token_id)
        len_rng, tok_rng, arr_rng, pri_rng = (
            np.random.default_rng(s) for s in np.random.SeedSequence(self.seed).spawn(4))
        n = self.num_requests or default_num_requests(interpreted)
        prompt_lens = self.prompt_len.sample(len_rng, n)
        output_lens = self.output_len.sample(len_rng, n)
        prompts = self._prompts(tokens, tok_rng, prompt_lens)
        arrivals = arrival_times(self.arrival, n, self.rate, self.burstiness, arr_rng)
        priorities = pri_rng.integers(0, self.num_priorities, size=n)
        out = [
            WorkloadRequest(
                prompt_token_ids=prompts[i],
                sampling_params=SamplingParams(**self.sampling, max_tokens=int(output_lens[i])),
                arrival_time=float(arrivals[i]),
                priority=int(priorities[i]),
                client_id=f"client{i % self.num_clients}" if self.num_clients else None,
                request_id=str(i),
            )
            for i in range(n)
        ]
        return sorted(out, key=lambda r: r.arrival_time)  # stable: ties keep index order

    def _prompts(
        self, tokens: TokenSampler, rng: np.random.Generator, lens: np.ndarray
    ) -> list[list[int]]:
        n, groups = len(lens), self.num_prefix_groups
        if not groups:
            return [tokens.draw(rng, int(length)) for length in lens]
        firsts = tokens.draw_distinct(rng, groups)
        prefixes = [[firsts[g], *tokens.draw(rng, self.prefix_len - 1)] for g in range(groups)]
        members = [list(range(g, n, groups)) for g in range(groups)]
        suffix_first = {}
        for g in range(groups):
            suffix_first.update(zip(members[g], tokens.draw_distinct(rng, len(members[g]))))
        return [
            prefixes[i % groups] + [suffix_first[i]]
            + tokens.draw(rng, int(lens[i]) - self.prefix_len - 1)
            for i in range(n)
        ]


def default_num_requests(interpreted: bool) -> int:
    """What `num_requests: null` means: DEFAULT_NUM_REQUESTS, or INTERPRETER_NUM_REQUESTS when
    Triton kernels run in Triton's interpreter (no CUDA), which is ~100x slower per step."""
    return INTERPRETER_NUM_REQUESTS if interpreted else DEFAULT_NUM_REQUESTS

