"""`sim/step_time=profiled`: a linear model of step time fitted to measured steps.

    t = c0 + c1 prefill tokens + c2 decodes + c3 prefill attention pairs
           + c4 decode context tokens + c5 prefill chunks

with non-negative coefficients (each feature can only add time), fitted by
`python -m lab.sim.profile RUN_DIR... -o profile.json` to the steps.jsonl of real runs (target:
the time from one step's end to the next while the engine is busy, the whole loop; minimising
each step's relative error) and loaded with
`sim/step_time=profiled sim.step_time.path=profile.json`. The profile holds the coefficients,
the feature names, the model and device it was measured on, and the fit's error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lab.core.step import StepShape
from lab.sim.step_time.base import StepTimeModel

log = logging.getLogger(__name__)

#: feature name -> its value for a step (from a StepShape)
FEATURES: dict[str, Callable[[StepShape], float]] = {
    "const": lambda s: 1.0,
    "prefill_tokens": lambda s: s.num_prefill_tokens,
    "decode_reqs": lambda s: s.num_decode_reqs,
    "prefill_attention_pairs": lambda s: s.prefill_attention_pairs,
    "decode_context_tokens": lambda s: s.decode_context_tokens,
    "prefill_reqs": lambda s: s.num_prefill_reqs,
}


def features(shape: StepShape, names: list[str] | tuple[str, ...] = tuple(FEATURES)) -> list[float]:
    """The feature vector of a step."""
    return [float(FEATURES[n](shape)) for n in names]


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0 (Lawson-Hanson active set; numpy only)."""
    m, n = a.shape
    x, passive = np.zeros(n), np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    tol = 10 * np.finfo(float).eps * np.linalg.norm(a, 1) * max(m, n)
    for _ in range(max_iter or 3 * n):
        if passive.all() or w[~passive].max(initial=-np.inf) <= tol:
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if not passive.any() or z[passive].min() > 0:
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > tol
        x = z
        w = a.T @ (b - a @ x)
    return x


def fit(
    x: np.ndarray, y: np.ndarray, relative: bool = True, iterations: int = 8,
) -> tuple[np.ndarray, dict[str, float]]:
    """Non-negative least squares of y on the columns of x; returns the coefficients and the
    fit's error (rmse_s, mape, r2).

    relative: minimise each step's error relative to its predicted time (iteratively
    reweighted: rows weighted by 1 / prediction, from the absolute fit on). A run has many small
    decode steps and a few large prefill steps; an absolute fit serves the large ones and misses
    the small ones, which decide TPOT. Weighting by 1 / measured time instead biases every
    prediction low (a step measured slow by noise gets less weight). How much, on the
    validation's profiling runs: experiments/sim_validation/README.md."""
    coef = _weighted_nnls(x, y, np.ones_like(y))
    for _ in range(iterations if relative else 0):
        coef = _weighted_nnls(x, y, 1.0 / np.maximum(x @ coef, 1e-9))
    pred = x @ coef
    resid = y - pred
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return coef, {
        "rmse_s": float(np.sqrt((resid ** 2).mean())),
        "mape": float(np.mean(np.abs(resid) / np.maximum(np.abs(y), 1e-12))),
        "r2": 1.0 - float((resid ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0,
        "num_steps": int(len(y)),
    }


def _weighted_nnls(x: np.ndarray, y: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """nnls of (weight * y) on (weight * x), columns scaled to unit norm for conditioning."""
    xw, yw = x * weight[:, None], y * weight
    scale = np.linalg.norm(xw, axis=0)
    scale[scale == 0] = 1.0
    return nnls(xw / scale, yw) / scale


class ProfiledStepTime(StepTimeModel):
    """A fitted profile (JSON written by `python -m lab.sim.profile`)."""

    def __init__(self, path: str | None = None, profile: dict[str, Any] | None = None) -> None:
        if profile is None:
            if not path:
                raise ValueError("sim/step_time=profiled needs sim.step_time.path=PROFILE.json "
                                 "(write one with `python -m lab.sim.profile RUN_DIR... -o "
                                 "PROFILE.json`)")
            if not Path(path).is_file():
                raise FileNotFoundError(f"sim.step_time.path={path!r}: no such profile (write "
                                        "one with `python -m lab.sim.profile RUN_DIR... -o "
                                        f"{path}`)")
            profile = json.loads(Path(path).read_text())
        self.names = list(profile["features"])
        unknown = sorted(set(self.names) - set(FEATURES))
        if unknown:
            raise ValueError(f"profile {path}: unknown features {unknown} (known: "
                             f"{', '.join(FEATURES)})")
        self.coef = [float(c) for c in profile["coefficients"]]
        self.profile = profile

    def predict(self, shape: StepShape) -> float:
        return max(sum(c * v for c, v in zip(self.coef, features(shape, self.names))), 0.0)
