"""`sim/step_time=profiled`: a step's time as the sum of its operators, each interpolated from a
microbenchmark sweep of the real engine on the machine to be simulated (Vidur's method).

    python -m lab.sim.profile model=tiny_llama -o profile.json       # the sweep (minutes)
    python run.py executor=sim sim/step_time=profiled sim.step_time.path=profile.json sim.device=cpu

A step of shape s (lab.core.step.StepShape) takes

    model(tokens)                     forward less attention: linears, norms, embedding, rotary
  + attention                         the backend's forward, every layer, by how it batches:
        padded backends (attention=torch, cpu; AttentionBackend.padded_batches):
            decode steps   decode(requests, max context)
            other steps    padded(requests x max context, max_query_len)   every request's
                           keys gathered and max_query_len padded queries attending to them
        ragged backends (triton_*):
            decode(decodes, mean context) + sum over prefill chunks of prefill(q, c + q),
            each less the fixed cost of a call (the cheapest decode measured) but one
  + logits(rows) + sampling(rows)     LM head and sampler over the requests that sample, + the
                                      drafts verified (a verification scores 1 + s rows)
  + cpu                               everything else of the engine's loop: scheduling, input
                                      preparation, output processing, statistics, the replay:
                                      decode(requests) of a steady decode step, + a per new
                                      request + b per finishing request + c per prefill token
                                      + d for a step with any prefill + e for the first step
                                      after the engine waited for an arrival (a cold step, and
                                      the wait's oversleep, which a real TTFT includes)

`model`, `logits`, `sampling` and the cpu term's steady decode part are curves over one count,
`decode`, `prefill` and `padded` are surfaces over (x, key): a curve per measured key,
interpolated between them; everything piecewise linear, extrapolated linearly past the sweep. The cpu term's
extras are a non-negative least-squares fit to what the decode curve leaves of every step's
overhead (the sweep varies them independently). Each point keeps the median and p10/p90 of its
samples.

Variance (`variance`): `median` predicts the median step; `sample` multiplies it by a ratio drawn
(seeded) from the profile's distribution of measured / predicted step times over the sweep's
steps, so tails are not systematically low. The profile stores the machine, commit and engine
configuration it was measured with; `describe()` says which mode a run used.

Tensor parallelism: a profile is measured on one rank (tensor_parallel_size=1). At TP = n the
model, attention and logits operators are taken as 1/n of the profile's (each rank holds 1/n of
the heads and linear columns), sampling and the CPU term as measured, and the executor adds the
step's collectives (lab/sim/comm.py): the device's ring model, or the table a profile measured
with `python -m lab.sim.profile --allreduce-ranks n` through `sim.allreduce=PROFILE.json`. An
approximation: the split GEMMs of a small model do not scale perfectly.

Sliding windows: the sweep runs the real model, so a profile of a model whose layers slide
(Mistral, Gemma, gpt-oss) measured its attention with the windows applied, as the backend
applies them, up to the sweep's longest context (`--max-context`, 512 by default). Past it the
surfaces extrapolate linearly in context, which a sliding layer is not once the context
passes its window (it reads W keys however long the request): profile to a context past the
largest window to see the flattening; `bind` warns when no measured context reaches a window.
"""

from __future__ import annotations

import json
import logging
import random
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.core.step import StepShape
from lab.sim.step_time.base import SimTarget, StepTimeModel

log = logging.getLogger(__name__)

PROFILE_KIND = "lab.sim.step_time.profiled/operators-1"
VARIANCE_MODES = ("median", "sample")
#: the cpu term's features, in the order of the profile's coefficients
CPU_FEATURES = ("new_requests", "finished_requests", "prefill_tokens", "prefill_step",
                "after_idle")


@dataclass(frozen=True)
class Curve:
    """Piecewise-linear y(x) through measured points, floored at 0. Past the last point it goes
    on along the line from the middle point to the last (a slope over half the range, not the
    last two noisy points'), before the first along the line from the first to the middle."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.xs or len(self.xs) != len(self.ys) or list(self.xs) != sorted(set(self.xs)):
            raise ValueError(f"a curve needs increasing distinct x with one y each: {self.xs}")

    def at(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        n = len(xs)
        if n == 1:
            return ys[0] * x / xs[0] if xs[0] else ys[0]  # one point: proportional
        if x > xs[-1]:
            i, j = n // 2 if n > 2 else 0, n - 1
        elif x < xs[0]:
            i, j = 0, max(n // 2, 1)
        else:
            j = min(max(bisect_right(xs, x), 1), n - 1)  # the segment [j-1, j]
            i = j - 1
        x0, x1, y0, y1 = xs[i], xs[j], ys[i], ys[j]
        return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.0)

    @classmethod
    def of(cls, points: dict[str, Any], key: str = "median") -> Curve:
        return cls(tuple(points["x"]), tuple(points[key]))


@dataclass(frozen=True)
class Surface:
    """f(x, key): a Curve over x for each measured key length, linear between them in key
    (extrapolated linearly past the first and last)."""

    keys: tuple[float, ...]
    curves: tuple[Curve, ...]

    def at(self, x: float, key: float) -> float:
        keys = self.keys
        if len(keys) == 1:
            return self.curves[0].at(x)
        i = min(max(bisect_right(keys, key), 1), len(keys) - 1)
        k0, k1 = keys[i - 1], keys[i]
        y0, y1 = self.curves[i - 1].at(x), self.curves[i].at(x)
        if not k0 <= key <= k1:  # past the rows: more keys never cost less
            y1 = max(y1, y0) if key > k1 else y1
            y0 = min(y0, y1) if key < k0 else y0
        return max(y0 + (y1 - y0) * (key - k0) / (k1 - k0), 0.0)

    @classmethod
    def of(cls, rows: list[dict[str, Any]], key: str = "median") -> Surface:
        rows = sorted(rows, key=lambda r: r["key"])
        return cls(tuple(r["key"] for r in rows), tuple(Curve.of(r, key) for r in rows))


@dataclass(frozen=True)
class Operators:
    """The interpolated operators of one profile (see the module docstring)."""

    model: Curve
    logits: Curve
    sampling: Curve
    decode: Surface
    prefill: Surface | None  # ragged backends: per chunk, over (q, c + q)
    padded: Surface | None  # padded backends: over (requests x max context, max query)
    cpu_decode: Curve  # the engine's CPU time of a steady decode step, by requests
    cpu: tuple[float, ...]  # CPU_FEATURES coefficients
    padded_batches: bool
    block_size: int
    call: float = 0.0  # the fixed cost of an attention call: one decode of the shortest context

    @classmethod
    def of(cls, profile: dict[str, Any]) -> Operators:
        ops = profile["operators"]
        decode = Surface.of(ops["decode"])
        padded_layout = bool(profile["attention_padded"])
        return cls(Curve.of(ops["model"]), Curve.of(ops["logits"]), Curve.of(ops["sampling"]),
                   decode, None if padded_layout else Surface.of(ops["prefill"]),
                   Surface.of(ops["padded"]) if padded_layout else None,
                   Curve.of(ops["cpu"]["decode"]),
                   tuple(ops["cpu"]["coefficients"]), padded_layout,
                   int(profile["config"]["block_size"]),
                   min(c.ys[0] for c in decode.curves))

    def parts(self, s: StepShape) -> dict[str, float]:
        """Seconds of each operator of a step of shape s."""
        rows = s.num_sampled_reqs + s.num_draft_tokens
        return {"model": self.model.at(s.num_tokens) if s.num_tokens else 0.0,
                "attention": self.attention(s),
                "logits": self.logits.at(rows) if rows else 0.0,
                "sampling": self.sampling.at(rows) if rows else 0.0,
                "cpu": self.cpu_seconds(s)}

    def attention(self, s: StepShape) -> float:
        if s.num_tokens == 0:
            return 0.0
        bs = self.block_size
        if self.padded_batches:
            if s.num_prefill_reqs == 0:
                return self.decode.at(*decode_point(s, True, bs))
            return self.padded.at(*padded_point(s, bs))
        parts = [self.prefill.at(*chunk_point(q, c, bs)) for q, c in s.prefill_chunks]
        if s.num_decode_reqs:
            parts.append(self.decode.at(*decode_point(s, False, bs)))
        return self.call + sum(max(p - self.call, 0.0) for p in parts)

    def cpu_seconds(self, s: StepShape) -> float:
        per_new, per_finished, per_token, per_prefill, per_idle = self.cpu
        return (self.cpu_decode.at(s.num_reqs) + per_new * s.num_new_reqs
                + per_finished * s.num_finished_reqs + per_token * s.num_prefill_tokens
                + per_prefill * (s.num_prefill_reqs > 0) + per_idle * s.after_idle)

    def predict(self, s: StepShape, tensor_parallel_size: int = 1) -> float:
        parts = self.parts(s)
        if tensor_parallel_size > 1:
            for name in ("model", "attention", "logits"):  # the split operators
                parts[name] /= tensor_parallel_size
        return sum(parts.values())


def whole_blocks(tokens: float, block_size: int) -> int:
    return int(-(-tokens // block_size) * block_size)


def decode_point(s: StepShape, padded: bool, block_size: int) -> tuple[float, float]:
    """(decodes, context in whole blocks) of a decode surface: the longest context for a padded
    backend (it gathers every request's keys up to it), the mean for a ragged one."""
    context = s.max_context_len if padded else s.decode_context_tokens / s.num_decode_reqs
    return s.num_decode_reqs, whole_blocks(context, block_size)


def padded_point(s: StepShape, block_size: int) -> tuple[float, float]:
    """(requests x longest context, longest query) of a padded step, in whole blocks."""
    return (s.num_reqs * whole_blocks(s.max_context_len, block_size),
            whole_blocks(s.max_query_len, block_size))


def chunk_point(q: int, c: int, block_size: int) -> tuple[float, float]:
    """(new tokens, keys in whole blocks) of one prefill chunk in a ragged backend's surface."""
    return q, whole_blocks(c + q, block_size)


def load_profile(path: str | Path) -> dict[str, Any]:
    """A profile written by `python -m lab.sim.profile`, checked to be one."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"sim.step_time.path={str(path)!r}: no such profile (write one "
                                f"with `python -m lab.sim.profile [OVERRIDES...] -o {path}`)")
    profile = json.loads(Path(path).read_text())
    if profile.get("kind") != PROFILE_KIND:
        raise ValueError(f"sim.step_time.path={str(path)!r} is not an operator profile (kind "
                         f"{profile.get('kind')!r}, expected {PROFILE_KIND!r}): write one with "
                         "`python -m lab.sim.profile [OVERRIDES...]`")
    return profile


class ProfiledStepTime(StepTimeModel):
    """Operator-level step times from a profile (JSON written by `python -m lab.sim.profile`)."""

    def __init__(self, path: str | None = None, variance: str = "median", seed: int = 0,
                 profile: dict[str, Any] | None = None) -> None:
        if variance not in VARIANCE_MODES:
            raise ValueError(f"sim.step_time.variance={variance!r}: use one of "
                             f"{', '.join(VARIANCE_MODES)}")
        if profile is None:
            if not path:
                raise ValueError("sim/step_time=profiled needs sim.step_time.path=PROFILE.json "
                                 "(write one with `python -m lab.sim.profile [OVERRIDES...] -o "
                                 "PROFILE.json`)")
            profile = load_profile(path)
        self.path, self.variance, self.seed = path, variance, int(seed)
        self.tensor_parallel_size = 1  # of the run it is bound to
        self.profile = profile
        self.operators = Operators.of(profile)
        self.ratios = tuple(profile["step_ratio_quantiles"])
        self._rng = random.Random(self.seed)

    def bind(self, target: SimTarget) -> ProfiledStepTime:
        """A fresh model (its own random stream from the seed) for a run."""
        if not target.device.is_cpu and self.profile.get("device") == "cpu":
            log.warning("a CPU profile (%s) simulates %s: its times are this machine's, not the "
                        "device's", self.path, target.device.name)
        windows = [w for w in target.model.layer_windows if w is not None]
        measured = max(self.operators.decode.keys)
        if windows and measured < min(windows):
            log.warning("the profile %s measured decode contexts up to %d, inside the model's "
                        "sliding windows (%s): past them its attention is extrapolated linearly "
                        "while the sliding layers read a window's keys (module docstring)",
                        self.path, measured, ", ".join(map(str, sorted(set(windows)))))
        bound = ProfiledStepTime(self.path, self.variance, self.seed, self.profile)
        bound.tensor_parallel_size = target.tensor_parallel_size
        return bound

    def predict(self, shape: StepShape) -> float:
        t = self.operators.predict(shape, self.tensor_parallel_size)
        if self.variance == "sample":
            t *= self._ratio(self._rng.random())
        return t

    def _ratio(self, u: float) -> float:
        """The measured / predicted ratio at quantile u (linear between stored quantiles)."""
        q = self.ratios
        pos = u * (len(q) - 1)
        i = min(int(pos), len(q) - 2)
        return q[i] + (q[i + 1] - q[i]) * (pos - i)

    def describe(self) -> str:
        machine = self.profile.get("machine", {}).get("cpu", "?")
        return (f"profiled operators ({self.profile.get('model')}, {machine}, variance "
                f"{self.variance}{f' seed {self.seed}' if self.variance == 'sample' else ''})")
