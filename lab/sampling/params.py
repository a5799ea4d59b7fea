"""SamplingParams: what a request asks of the sampler and of the stop checks.

Defaults follow vLLM (temperature 1.0, max_tokens 16, top_k 0 = off). SamplingParams are frozen:
every field is validated on construction (a bad value raises ValueError naming the field and what
is allowed) and cannot change afterwards; `dataclasses.replace(params, temperature=0.5)` makes a
validated copy. The engine validates again where a request enters it (`as_sampling_params`), which
also accepts a plain dict of fields, as vLLM users write them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

_GREEDY_EPS = 1e-5
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what a 64-bit generator seed can hold


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling and stopping parameters (vLLM's names and defaults)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()  # a list is accepted and stored as a tuple
    ignore_eos: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop_token_ids, list | tuple):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        self.validate()
        if self.is_greedy:  # greedy ignores the truncation knobs, as in vLLM
            for name, off in (("top_p", 1.0), ("top_k", 0), ("min_p", 0.0)):
                object.__setattr__(self, name, off)

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field and what it allows."""
        for name, ok, allowed in self._checks():
            if not ok:
                raise ValueError(
                    f"SamplingParams.{name}={getattr(self, name)!r} is invalid: must be {allowed}"
                )

    def _checks(self) -> list[tuple[str, bool, str]]:
        stops = self.stop_token_ids
        return [
            ("temperature", _is_number(self.temperature) and self.temperature >= 0,
             "a finite number >= 0 (0 means greedy)"),
            ("top_p", _is_number(self.top_p) and 0 < self.top_p <= 1, "a number in (0, 1]"),
            ("top_k", _is_int(self.top_k) and (self.top_k >= 0 or self.top_k == -1),
             "an integer >= 1, or 0 / -1 for off"),
            ("min_p", _is_number(self.min_p) and 0 <= self.min_p <= 1, "a number in [0, 1]"),
            ("seed", self.seed is None or (_is_int(self.seed) and SEED_MIN <= self.seed <= SEED_MAX),
             "None or an integer that fits in 64 bits, in [-2**63, 2**64 - 1]"),
            ("max_tokens", _is_int(self.max_tokens) and self.max_tokens >= 1, "an integer >= 1"),
            ("min_tokens", _is_int(self.min_tokens) and _is_int(self.max_tokens)
             and 0 <= self.min_tokens <= self.max_tokens, "an integer in [0, max_tokens]"),
            ("stop_token_ids", isinstance(stops, tuple) and all(_is_int(t) and t >= 0 for t in stops),
             "a list of non-negative integers"),
            ("ignore_eos", isinstance(self.ignore_eos, bool), "True or False"),
            ("skip_special_tokens", isinstance(self.skip_special_tokens, bool), "True or False"),
        ]

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS


FIELDS = tuple(f.name for f in fields(SamplingParams))


def as_sampling_params(value: object, where: str = "sampling_params") -> SamplingParams:
    """The SamplingParams a request enters the engine with: a SamplingParams (validated again:
    it may have been built around the frozen checks) or a dict of its fields (vLLM-style
    keyword arguments). Anything else is a TypeError naming `where`."""
    if isinstance(value, SamplingParams):
        value.validate()
        return value
    if isinstance(value, Mapping):
        unknown = sorted(str(k) for k in value if k not in FIELDS)
        if unknown:
            raise ValueError(f"{where} has unknown field(s) {', '.join(unknown)}: SamplingParams "
                             f"fields are {', '.join(FIELDS)}")
        return SamplingParams(**value)
    raise TypeError(f"{where} must be a SamplingParams or a dict of its fields "
                    f"({', '.join(FIELDS)}), not {type(value).__name__}")


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return (isinstance(x, int | float) and not isinstance(x, bool)
            and x == x and x not in (float("inf"), float("-inf")))  # rejects NaN and inf
