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
