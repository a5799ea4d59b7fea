"""The simulator's knobs (the `sim` block: `sim.device=h200`), declared beside its code the way a
plug-in declares its own (lab/config/knob.py); `sim/step_time` is a config group nested in it and
`sim.spec` a block of its own (speculative decoding, lab/sim/spec.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lab.config.knob import knob
from lab.sim.device import DEVICES


@dataclass(frozen=True)
class SimSpecKnobs:
    """executor=sim with a `speculative` option: how its verifications go and what its proposer
    costs (lab/sim/spec.py). No proposer runs; only these numbers decide."""

    acceptance_rate: float = knob(
        0.7, "speculative: the chance the target accepts a draft, per draft position (each "
        "position independent, the first rejection ends the run)", ge=0, le=1,
        details="the geometric model of Leviathan et al.: k drafts accept their first j with "
                "probability alpha^j, sum over j = 1..k of alpha^j accepted on average; "
                "ignored when sim.spec.acceptance_from is set")
    acceptance_from: str | None = knob(
        None, "speculative: a real run's steps.jsonl (or its run directory) whose measured "
        "acceptance per draft position replaces acceptance_rate",
        null="acceptance_rate's geometric model",
        details="position j's rate is sum accepted_per_position[j] / sum num_spec_reqs over "
                "its steps; the run must have drafted at least num_speculative_tokens")
    draft_cost_ratio: float = knob(
        0.0, "speculative: one forward of the proposer's draft model as a fraction of the "
        "target's decode step over the same requests; a step that drafts k adds k of them",
        ge=0, details="0: a proposer without a model (ngram); e.g. 0.05 for a draft model 1/20 "
                      "of the target's cost (draft, mtp)")


@dataclass(frozen=True)
class SimKnobs:
    """executor=sim only (docs/simulator.md)."""

    device: str = knob("h100", "the device executor=sim simulates (lab/sim/device.py)",
                       choices=tuple(DEVICES))
    allreduce: str | None = knob(
        None, "tensor_parallel_size > 1: a measured all-reduce table (JSON) to cost the "
        "collectives with", null="the device's ring model, lab/sim/comm.py",
        details="written by `python -m lab.sim.comm -n TP -o PATH`; its world size must be "
                "tensor_parallel_size")
    spec: SimSpecKnobs = field(default_factory=SimSpecKnobs)
