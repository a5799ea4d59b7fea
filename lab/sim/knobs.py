"""The simulator's knobs (the `sim` block: `sim.device=h200`), declared beside its code the way a
plug-in declares its own (lab/config/knob.py); `sim/step_time` is a config group nested in it."""

from __future__ import annotations

from dataclasses import dataclass

from lab.config.knob import knob
from lab.sim.device import DEVICES


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
