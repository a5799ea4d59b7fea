"""SamplingParams: what a request asks of the sampler and of the stop checks.

Defaults follow vLLM (temperature 1.0, max_tokens 16, top_k 0 = off). Every field is validated on
construction; a bad value raises ValueError naming the field and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_GREEDY_EPS = 1e-5


@dataclass
class SamplingParams:
    """Per-request sampling and stopping parameters (vLLM's names and defaults)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._validate()
        if self.is_greedy:
            # Greedy ignores the truncation knobs, as in vLLM.
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0

    def _validate(self) -> None:
        checks = [
            ("temperature", _is_number(self.temperature) and self.temperature >= 0,
             "a number >= 0 (0 means greedy)"),
            ("top_p", _is_number(self.top_p) and 0 < self.top_p <= 1, "a number in (0, 1]"),
            ("top_k", _is_int(self.top_k) and (self.top_k >= 0 or self.top_k == -1),
             "an integer >= 1, or 0 / -1 for off"),
            ("min_p", _is_number(self.min_p) and 0 <= self.min_p <= 1, "a number in [0, 1]"),
            ("seed", self.seed is None or _is_int(self.seed), "an integer or None"),
            ("max_tokens", _is_int(self.max_tokens) and self.max_tokens >= 1, "an integer >= 1"),
            ("min_tokens", _is_int(self.min_tokens) and 0 <= self.min_tokens <= self.max_tokens,
             "an integer in [0, max_tokens]"),
            ("stop_token_ids", all(_is_int(t) and t >= 0 for t in self.stop_token_ids),
             "a list of non-negative integers"),
            ("ignore_eos", isinstance(self.ignore_eos, bool), "True or False"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(
                    f"SamplingParams.{name}={getattr(self, name)!r} is invalid: must be {allowed}"
                )

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and x == x  # rejects NaN
