"""Speculative decoding under `executor=sim`: what stands in for the proposer and the rejection
sampler, so a simulated run prices speculation without a model (lab/speculative for the real
thing).

    python run.py executor=sim speculative=ngram sim.spec.acceptance_rate=0.8
    python run.py executor=sim speculative=ngram sim.spec.acceptance_from=outputs/DAY/TIME

- **Drafts.** Every request that emitted tokens gets min(k, room) drafts, room capped as the
  real runner caps it: max_model_len - 1 - its length (the scheduler would cut the rest: the
  verified positions stay below max_model_len - 1) and its max_tokens left - 1 (a draft past its
  last token is never kept). The ids are the simulator's token rule at the next positions (never
  EOS nor a stop token), so accepted drafts are exactly the tokens it would have emitted anyway:
  outputs do not depend on speculation.
- **Verification.** Each draft position is accepted with its own probability given that every
  earlier one was, and the first rejection ends the run (the rejection sampler keeps the longest
  accepted prefix + 1 token). With `sim.spec.acceptance_rate` alpha every position has
  probability alpha: the geometric model of Leviathan et al. (2023), P(first j accepted) =
  alpha^j, sum over j = 1..k of alpha^j drafts accepted per verification on average. With
  `sim.spec.acceptance_from` the survival curve is a real run's measured one (measured_acceptance:
  position j's accepted count over the verifications). The draws come from one generator seeded
  by the run's `seed`: a rerun is identical.
- **Cost.** The verifying step is priced as what it is: a request with s drafts computes 1 + s
  tokens (a chunk q = 1 + s in StepShape.prefill_chunks, whose attention and linears the
  step-time model prices like any chunk's) and its LM head scores 1 + s rows
  (StepShape.num_draft_tokens). A model-based proposer (draft, mtp) adds its own forwards:
  `sim.spec.draft_cost_ratio` x the target's decode step over the drafting requests, once per
  draft position; ngram's lookup is free (ratio 0, the default).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lab.core.step import StepShape
from lab.metrics.jsonl import STEPS_FILE
from lab.sim.knobs import SimSpecKnobs


def measured_acceptance(path: str | Path) -> tuple[float, ...]:
    """A real run's acceptance per draft position, from its steps.jsonl (the file or its run
    directory): position j's rate is sum accepted_per_position[j] / sum num_spec_reqs, the
    fraction of verifications that accepted their first j + 1 drafts (vLLM's per-position
    acceptance). A verification cut short (by max_tokens, a budget) counts in the denominator
    of every position, as vLLM counts it."""
    path = Path(path)
    if path.is_dir():
        path = path / STEPS_FILE
    verifications, accepted = 0, np.zeros(0, dtype=np.int64)
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            record = json.loads(line)
            verifications += record.get("num_spec_reqs", 0)
            accepted = _add_padded(accepted, record.get("accepted_per_position", []))
    if verifications == 0:
        raise ValueError(f"{path}: no step verified drafts (num_spec_reqs is 0 throughout): "
                         "measure a run with a speculative option and the jsonl logger")
    return tuple(float(a) / verifications for a in accepted)


def _add_padded(total: np.ndarray, counts: Sequence[int]) -> np.ndarray:
    """total + counts, the shorter one padded with zeros."""
    out = np.zeros(max(len(total), len(counts)), dtype=np.int64)
    out[: len(total)] += total
    out[: len(counts)] += np.asarray(counts, dtype=np.int64)
    return out


class Acceptance:
    """How many of a verification's drafts are accepted: position j (0-based) survives with
    probability survival[j] / survival[j - 1] given the ones before it did (survival[j]: the
    chance that the first j + 1 are all accepted), drawn from a seeded generator."""

    def __init__(self, survival: Sequence[float], seed: int = 0) -> None:
        survival = [float(s) for s in survival]
        if any(not 0 <= s <= 1 for s in survival) or any(
                b > a + 1e-12 for a, b in zip(survival, survival[1:])):
            raise ValueError(f"acceptance per draft position {survival} must be in [0, 1] and "
                             "non-increasing (a draft is kept only after every earlier one)")
        self.survival = tuple(survival)
        before = np.array([1.0, *survival[:-1]])
        with np.errstate(divide="ignore", invalid="ignore"):
            self.conditional = np.where(before > 0, np.array(survival) / before, 0.0).clip(0, 1)
        self.rng = np.random.default_rng(seed)

    @classmethod
    def geometric(cls, alpha: float, k: int, seed: int = 0) -> Acceptance:
        """Every position accepted with probability alpha: survival alpha^(j + 1)."""
        return cls([alpha ** (j + 1) for j in range(k)], seed)

    def draw(self, num_drafts: int) -> int:
        """Drafts accepted of `num_drafts` (<= k): the first rejection ends the run."""
        if num_drafts == 0:
            return 0
        kept = self.rng.random(num_drafts) < self.conditional[:num_drafts]
        return num_drafts if kept.all() else int(np.argmin(kept))

    def expected(self, num_drafts: int) -> float:
        """Mean drafts accepted of `num_drafts`: the sum of the survival curve over them."""
        return float(sum(self.survival[:num_drafts]))


@dataclass
class SimSpeculation:
    """The simulator's speculation: k drafts per request, an acceptance model, the proposer's
    cost as a fraction of a target decode step per draft position."""

    k: int
    acceptance: Acceptance
    draft_cost_ratio: float = 0.0

    @classmethod
    def of(cls, k: int, knobs: SimSpecKnobs, seed: int = 0) -> SimSpeculation | None:
        """From the speculative option's k (0: off, None) and the `sim.spec` knobs."""
        if k == 0:
            return None
        if knobs.acceptance_from is None:
            acceptance = Acceptance.geometric(knobs.acceptance_rate, k, seed)
        else:
            measured = measured_acceptance(knobs.acceptance_from)
            if len(measured) < k:
                raise ValueError(
                    f"sim.spec.acceptance_from={knobs.acceptance_from!r} measured "
                    f"{len(measured)} draft positions; num_speculative_tokens={k} needs {k}")
            acceptance = Acceptance(measured[:k], seed)
        return cls(k, acceptance, knobs.draft_cost_ratio)

    def num_drafts(self, length: int, end: int, max_model_len: int) -> int:
        """Drafts for a request of `length` tokens that finishes at `end` (prompt + max_tokens),
        capped as the real runner caps them (lab/worker/model_runner.py, _propose): below
        max_model_len - 1, and below its last token."""
        room = min(max(max_model_len - 1 - length, 0), max(end - length - 1, 0))
        return min(self.k, room)


def draft_shape(contexts: Sequence[int]) -> StepShape:
    """A target decode step over requests of these lengths: what one forward of a draft model
    is priced against (x sim.spec.draft_cost_ratio)."""
    n = len(contexts)
    return StepShape(num_tokens=n, num_decode_reqs=n, decode_context_tokens=sum(contexts),
                     max_query_len=1 if n else 0, max_context_len=max(contexts, default=0),
                     num_sampled_reqs=n)
