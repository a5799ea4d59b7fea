"""The `sim/step_time` config group: how long a simulated step takes (see base.py)."""

from lab.sim.step_time.base import SimTarget, StepTimeModel

__all__ = ["SimTarget", "StepTimeModel"]
