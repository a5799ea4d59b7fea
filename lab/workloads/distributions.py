"""Random pieces of synthetic workloads: length distributions, arrival processes, token ids.

All draw from a caller's `numpy.random.Generator`, so a workload is deterministic given its seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from omegaconf import OmegaConf

LENGTH_DISTS = ("uniform", "fixed", "normal", "lognormal")
ARRIVALS = ("batch", "poisson", "gamma")


def to_plain(spec: Any) -> Any:
    """A DictConfig/ListConfig as plain Python containers; anything else unchanged."""
    return OmegaConf.to_container(spec, resolve=True) if OmegaConf.is_config(spec) else spec


def is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_num(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and not math.isnan(x)


def check_int(name: str, value: object, low: int) -> None:
    """Refuse a knob that is not an integer >= low, naming it."""
    if not (is_int(value) and value >= low):
        raise ValueError(f"{name}={value!r} must be an integer >= {low}")


@dataclass(frozen=True)
class LengthDist:
    """Token-length distribution, clipped to [min, max] and rounded to integers.

    `uniform`: integers in [min, max]. `fixed`: always `value` (default max). `normal` and
    `lognormal`: the lengths' own mean/std (defaults (min+max)/2 and (max-min)/4).
    Written in YAML as a mapping (`{dist: uniform, min: 16, max: 128}`) or a bare int (fixed).
    """

    dist: str = "uniform"
    min: int = 1
    max: int = 1
    mean: float | None = None
    std: float | None = None
    value: int | None = None
    name: str = "length"  # the workload field, for error messages

    @classmethod
    def parse(cls, spec: Any, name: str) -> LengthDist:
        spec = to_plain(spec)
        if is_int(spec):
            spec = {"dist": "fixed", "value": spec}
        if not isinstance(spec, Mapping):
            raise ValueError(f"{name}={spec!r} must be an int or a mapping with dist/min/max")
        allowed = {f.name for f in fields(cls)} - {"name"}
        for key in spec:
            if key not in allowed:
                raise ValueError(f"{name}.{key} is not a known key (allowed: {sorted(allowed)})")
        spec = dict(spec)
        if spec.get("dist") == "fixed" and spec.get("value") is None and "max" in spec:
            spec["value"] = spec["max"]
        if spec.get("dist") == "fixed" and is_int(spec.get("value")):
            spec["min"] = spec["max"] = spec["value"]
        dist = cls(**spec, name=name)
        dist.validate()
        return dist

    def validate(self) -> None:
        n = self.name
        if self.dist not in LENGTH_DISTS:
            raise ValueError(f"{n}.dist={self.dist!r} must be one of {LENGTH_DISTS}")
        if not (is_int(self.min) and self.min >= 1):
            raise ValueError(f"{n}.min={self.min!r} must be an integer >= 1")
        if not (is_int(self.max) and self.max >= self.min):
            raise ValueError(f"{n}.max={self.max!r} must be an integer >= {n}.min={self.min}")
        if self.dist == "fixed" and not (is_int(self.value) and self.value >= 1):
            raise ValueError(f"{n}.value={self.value!r} must be an integer >= 1 for dist=fixed")
        if self.mean is not None and not (is_num(self.mean) and self.mean > 0):
            raise ValueError(f"{n}.mean={self.mean!r} must be a number > 0")
        if self.std is not None and not (is_num(self.std) and self.std >= 0):
            raise ValueError(f"{n}.std={self.std!r} must be a number >= 0")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` lengths (int64)."""
        if self.dist == "fixed":
            return np.full(n, self.value, dtype=np.int64)
        if self.dist == "uniform":
            return rng.integers(self.min, self.max + 1, size=n, dtype=np.int64)
        mean = self.mean if self.mean is not None else (self.min + self.max) / 2
        std = self.std if self.std is not None else (self.max - self.min) / 4
        if self.dist == "normal":
            raw = rng.normal(mean, std, size=n)
        else:
            sigma2 = math.log1p((std / mean) ** 2)
            raw = rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), size=n)
        return np.clip(np.rint(raw), self.min, self.max).astype(np.int64)


def validate_arrival(arrival: str, rate: float | None, burstiness: float) -> None:
    """Raise ValueError naming the field if the arrival process is ill-specified."""
    if arrival not in ARRIVALS:
        raise ValueError(f"arrival={arrival!r} must be one of {ARRIVALS}")
    if arrival == "batch" and rate is not None:
        raise ValueError(f"rate={rate!r} has no effect with arrival=batch (every request at t=0): "
                         "set arrival=poisson or gamma to use a rate, or leave rate null")
    if arrival != "batch" and not (is_num(rate) and rate > 0):
        raise ValueError(f"rate={rate!r} must be a number > 0 (requests/s) for arrival={arrival}")
    if not (is_num(burstiness) and 0 < burstiness < math.inf):
        raise ValueError(f"burstiness={burstiness!r} must be a finite number > 0")


def arrival_times(
    arrival: str, n: int, rate: float | None, burstiness: float, rng: np.random.Generator
) -> np.ndarray:
    """Non-decreasing arrival times (s), the first at 0.

    Gaps are gamma(shape=burstiness, scale=1/(rate*burstiness)): mean 1/rate; burstiness 1 is
    Poisson (exponential gaps), < 1 is burstier, > 1 more regular. `rate=inf` is a batch.
    """
    if arrival == "batch" or rate is None or math.isinf(rate):
        return np.zeros(n)
    shape = 1.0 if arrival == "poisson" else float(burstiness)
    gaps = rng.gamma(shape, 1.0 / (rate * shape), size=max(n - 1, 0))
    return np.concatenate([[0.0], np.cumsum(gaps)])


class TokenSampler:
    """Uniform token ids in [low, vocab_size) that skip `eos_token_id`."""

    def __init__(self, vocab_size: int, eos_token_id: int | None, low: int) -> None:
        if not (is_int(vocab_size) and vocab_size > 0):
            raise ValueError(f"vocab_size={vocab_size!r} must be an integer > 0")
        self.low = low
        in_range = eos_token_id is not None and low <= eos_token_id < vocab_size
        self.eos = eos_token_id if in_range else None
        self.count = vocab_size - low - (self.eos is not None)
        if self.count < 1:
            raise ValueError(
                f"vocab_size={vocab_size} leaves no token ids at or above low_token_id={low}"
            )

    def _map(self, u: np.ndarray) -> list[int]:
        ids = u + self.low
        if self.eos is not None:
            ids = ids + (ids >= self.eos)
        return [int(x) for x in ids]

    def draw(self, rng: np.random.Generator, n: int) -> list[int]:
        """`n` ids, independent and uniform."""
        return self._map(rng.integers(0, self.count, size=n))

    def draw_distinct(self, rng: np.random.Generator, n: int) -> list[int]:
        """`n` ids, pairwise different when the vocabulary allows it."""
        if n > self.count:
            return self.draw(rng, n)
        return self._map(rng.choice(self.count, size=n, replace=False))
