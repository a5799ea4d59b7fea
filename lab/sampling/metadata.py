"""SamplingMetadata: the batch's sampling parameters as tensors, one step's view.

Mirrors vLLM V1's `v1/sample/metadata.py`: one row per request in the batch, plus flags that let the
sampler skip whole stages (the common all-greedy batch costs one argmax and nothing else).
`from_params` builds it from each row's SamplingParams: the definition, used by tests and
one-off callers. The model runner keeps the parameters as per-row arrays of its persistent batch
instead and reads the metadata from them, rebuilt only when the batch changed
(lab/worker/sampling_state.py; tests check both agree).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from lab.core.sampling_params import SamplingParams

_INT64_MAX = 2**63 - 1  # the most a top_k row holds (SamplingParams bounds top_k below only)


def top_k_value(top_k: int) -> int:
    """A top_k row: -1 and 0 both mean off (0); apply_top_k clamps k to the vocabulary, so the
    most an int64 row needs to hold is 2**63 - 1."""
    return min(max(int(top_k), 0), _INT64_MAX)


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A per-request RNG on `device`, seeded with `seed` (vLLM keeps one per seeded request)."""
    return torch.Generator(device=torch.device(device)).manual_seed(seed)


@dataclass
class SamplingMetadata:
    """Per-row sampling tensors for one step's batch of B requests.

    temperature: float32 [B]; greedy rows hold 1.0 so the sampler never divides by zero.
    top_k: int64 [B]; 0 means off (-1 in SamplingParams is stored as 0).
    top_p: float32 [B]; 1.0 means off.   min_p: float32 [B]; 0.0 means off.
    is_greedy: bool [B]. generators: one per row, None for unseeded and for greedy rows.
    The flags are batch-wide and let the sampler skip stages nobody asked for.
    max_num_logprobs: the most top logprobs a row asks for (-1: the whole vocabulary), None
    when no row asks for logprobs (then none are computed).
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    is_greedy: torch.Tensor
    all_greedy: bool
    all_random: bool
    no_top_k: bool
    no_top_p: bool
    no_min_p: bool
    generators: list[torch.Generator | None]
    max_num_logprobs: int | None = None

    @property
    def batch_size(self) -> int:
        return len(self.generators)

    def expand(self, repeats: list[int]) -> SamplingMetadata:
        """Row i repeated repeats[i] times (speculative decoding: one row per position a
        request's step verifies); the batch flags stay the same."""
        counts = torch.tensor(repeats, dtype=torch.int64, device=self.temperature.device)

        def rep(t: torch.Tensor) -> torch.Tensor:
            return t.repeat_interleave(counts, output_size=sum(repeats))

        return replace(self, temperature=rep(self.temperature), top_k=rep(self.top_k),
                       top_p=rep(self.top_p), min_p=rep(self.min_p),
                       is_greedy=rep(self.is_greedy),
                       generators=[g for g, n in zip(self.generators, repeats) for _ in range(n)])

    @property
    def seeded_rows(self) -> list[tuple[int, torch.Generator]]:
        """(row, generator) for every row that draws its noise from its own generator."""
        return [(i, g) for i, g in enumerate(self.generators) if g is not None]

    @classmethod
    def from_params(
        cls,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None] | None = None,
        device: torch.device | str = "cpu",
    ) -> SamplingMetadata:
        """Build the step's metadata from each row's params and (optional) generator."""
        if generators is None:
            generators = [None] * len(params)
        if len(generators) != len(params):
            raise ValueError(
                f"got {len(params)} SamplingParams but {len(generators)} generators; "
                "need one generator (or None) per row"
            )
        greedy = [p.is_greedy for p in params]
        temps = [1.0 if g else float(p.temperature) for p, g in zip(params, greedy)]
        top_ks = [top_k_value(p.top_k) for p in params]
        top_ps = [float(p.top_p) for p in params]
        asked = [p.logprobs for p in params if p.logprobs is not None]
        min_ps = [float(p.min_p) for p in params]
        return cls(
            temperature=torch.tensor(temps, dtype=torch.float32, device=device),
            top_k=torch.tensor(top_ks, dtype=torch.int64, device=device),
            top_p=torch.tensor(top_ps, dtype=torch.float32, device=device),
            min_p=torch.tensor(min_ps, dtype=torch.float32, device=device),
            is_greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            all_greedy=all(greedy),
            all_random=not any(greedy),
            no_top_k=all(k == 0 for k in top_ks),
            no_top_p=all(p >= 1.0 for p in top_ps),
            no_min_p=all(p <= 0.0 for p in min_ps),
            generators=[None if g else gen for g, gen in zip(greedy, generators)],
            max_num_logprobs=None if not asked else -1 if -1 in asked else max(asked),
        )
