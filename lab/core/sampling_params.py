"""SamplingParams: what a request asks of the sampler, the logits processors and the stop checks.

Names, defaults and validation messages follow vLLM's `SamplingParams` (0.32) for everything
that is not model-specific (no structured outputs, no pooling, no speculative decoding).
SamplingParams are frozen: every field is validated on construction (a bad value raises
ValueError naming the field and what is allowed) and cannot change afterwards;
`dataclasses.replace(params, temperature=0.5)` makes a validated copy. The engine validates
again where a request enters it (`as_sampling_params`, which also accepts a plain dict of
fields, as vLLM users write them) and checks what depends on the model there (vocabulary ids,
`logprobs` against `max_logprobs`, `bad_words` that tokenize: `lab.frontend.processor`).

Lists are stored as tuples (so the params stay immutable); `logit_bias` as a dict copy with int
keys (JSON gives string keys; they are converted, as vLLM's server does).

`extra_args` (vLLM's field) carries what a custom logits processor or plug-in reads per request
(`AddedRequest.params.extra_args`): a dict with string keys and JSON-like values (None, bool,
64-bit int, finite float, str, and lists / dicts of them), stored as a deep copy with tuples as
lists, so it crosses to an engine-core process (engine_client=mp) unchanged. A subclass of
SamplingParams crosses too (lab.engine.serial rebuilds it there by its import path).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any

_SAMPLING_EPS = 1e-5  # a temperature below this is greedy
_MIN_TEMP = 1e-2  # 0 < temperature < this is raised to this (vLLM: numerical safety)
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what a 64-bit generator seed can hold
MAX_N = 16384  # vLLM's VLLM_MAX_N_SEQUENCES default
MAX_NUM_BAD_WORDS = 128  # vLLM's VLLM_MAX_NUM_BAD_WORDS default (after tokenization)
_MAX_DEPTH = 32  # the deepest nesting of lists / dicts extra_args may have


class RequestOutputKind(enum.IntEnum):
    """What `LLMEngine.step()` reports for a running request (vLLM's names)."""

    CUMULATIVE = 0  # everything so far, every step
    DELTA = 1  # only what is new since the last report
    FINAL_ONLY = 2  # nothing until the request finishes


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling, logits-processing, stopping and output parameters."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()  # a str or a list is accepted
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0
    logprobs: int | None = None  # top-k logprobs per sampled token (+ the sampled one); -1: all
    prompt_logprobs: int | None = None  # the same for every prompt token after the first
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logit_bias: Mapping[int, float] | None = None
    allowed_token_ids: tuple[int, ...] | None = None
    include_stop_str_in_output: bool = False
    truncate_prompt_tokens: int | None = None  # keep the last k prompt tokens; -1: max_model_len
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    bad_words: tuple[str, ...] = ()
    # bad_words as token ids: filled in by the engine's Processor from the tokenizer (users set
    # bad_words); each entry bans its last token after its other tokens were generated.
    bad_words_token_ids: tuple[tuple[int, ...], ...] | None = None
    # free-form per-request arguments for custom logits processors and plug-ins (JSON-like)
    extra_args: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self._normalize()
        self.validate()
        if self.is_greedy:  # greedy ignores the truncation knobs, as in vLLM
            for name, off in (("top_p", 1.0), ("top_k", 0), ("min_p", 0.0)):
                object.__setattr__(self, name, off)

    def _normalize(self) -> None:
        """vLLM's conveniences: a str stop, True for logprobs, seed -1, duplicates dropped,
        a tiny temperature raised to 0.01; lists become tuples."""
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        if isinstance(self.stop, str):
            put("stop", (self.stop,))
        if self.seed == -1:
            put("seed", None)
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is True:
                put(name, 1)
        for name in ("stop", "stop_token_ids", "bad_words", "allowed_token_ids"):
            value = getattr(self, name)
            if isinstance(value, list | tuple):
                put(name, tuple(dict.fromkeys(value)) if name != "allowed_token_ids"
                    else tuple(value))
        if self.stop is None:
            put("stop", ())
        if self.stop_token_ids is None:
            put("stop_token_ids", ())
        if self.bad_words is None:
            put("bad_words", ())
        if isinstance(self.bad_words_token_ids, list | tuple):
            put("bad_words_token_ids", tuple(tuple(w) if isinstance(w, list | tuple) else w
                                             for w in self.bad_words_token_ids))
        if isinstance(self.logit_bias, Mapping):
            put("logit_bias", _int_keys(self.logit_bias))
        if isinstance(self.extra_args, Mapping):
            put("extra_args", _plain_copy(self.extra_args))
        if _is_int(self.output_kind) and self.output_kind in tuple(RequestOutputKind):
            put("output_kind", RequestOutputKind(self.output_kind))
        if _is_number(self.temperature) and 0 < self.temperature < _MIN_TEMP:
            put("temperature", _MIN_TEMP)

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field and what it allows."""
        for name, ok, message in self._checks():
            if not ok:
                raise ValueError(f"{message}, got {getattr(self, name)!r}. "
                                 f"(SamplingParams.{name})")

    def _checks(self) -> list[tuple[str, bool, str]]:
        """(field, valid?, vLLM's message) in vLLM's order."""
        return self._sampling_checks() + self._token_checks()

    def _sampling_checks(self) -> list[tuple[str, bool, str]]:
        """The sampling and length fields' checks (the first part of vLLM's order)."""
        return [
            ("n", _is_int(self.n) and 1 <= self.n <= MAX_N,
             f"n must be an int in [1, {MAX_N}]"),
            ("presence_penalty", _in(self.presence_penalty, -2.0, 2.0),
             "presence_penalty must be in [-2, 2]"),
            ("frequency_penalty", _in(self.frequency_penalty, -2.0, 2.0),
             "frequency_penalty must be in [-2, 2]"),
            ("repetition_penalty", _is_number(self.repetition_penalty)
             and self.repetition_penalty > 0, "repetition_penalty must be a finite number "
             "greater than zero"),
            ("temperature", _in(self.temperature, 0.0, 2.0),
             "temperature must be a finite number in [0, 2] (0 means greedy)"),
            ("top_p", _is_number(self.top_p) and 0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            ("top_k", _is_int(self.top_k) and self.top_k >= -1,
             "top_k must be 0 (disable), or at least 1 (-1 is accepted as 0)"),
            ("min_p", _in(self.min_p, 0.0, 1.0), "min_p must be in [0, 1]"),
            ("seed", self.seed is None or (_is_int(self.seed) and SEED_MIN <= self.seed <= SEED_MAX),
             "seed must be None or an integer that fits in 64 bits, in [-2**63, 2**64 - 1]"),
            ("max_tokens", self.max_tokens is None or (_is_int(self.max_tokens)
                                                       and self.max_tokens >= 1),
             "max_tokens must be None or at least 1"),
            ("min_tokens", _is_int(self.min_tokens) and self.min_tokens >= 0,
             "min_tokens must be an integer greater than or equal to 0"),
            ("min_tokens", self.max_tokens is None or not _is_int(self.max_tokens)
             or self.min_tokens <= self.max_tokens,
             f"min_tokens must be less than or equal to max_tokens={self.max_tokens}"),
            ("logprobs", _optional_k(self.logprobs), "logprobs must be None, non-negative or -1"),
            ("prompt_logprobs", _optional_k(self.prompt_logprobs),
             "prompt_logprobs must be None, non-negative or -1"),
        ]

    def _token_checks(self) -> list[tuple[str, bool, str]]:
        """The token, string, flag and extra fields' checks (the rest of vLLM's order)."""
        return [
            ("stop_token_ids", isinstance(self.stop_token_ids, tuple)
             and all(_is_int(t) and t >= 0 for t in self.stop_token_ids),
             "stop_token_ids must contain only non-negative integers"),
            ("stop", isinstance(self.stop, tuple) and all(isinstance(s, str) for s in self.stop),
             "stop must be a string or a list of strings"),
            ("stop", all(self.stop), "stop cannot contain an empty string"),
            ("stop", not self.stop or self.detokenize is True,
             "stop strings are only supported when detokenize is True. Set detokenize=True "
             "to use stop"),
            ("bad_words", isinstance(self.bad_words, tuple)
             and all(isinstance(w, str) and w for w in self.bad_words),
             "bad_words must be a list of non-empty strings"),
            ("bad_words_token_ids", self.bad_words_token_ids is None or (
                isinstance(self.bad_words_token_ids, tuple) and all(
                    isinstance(w, tuple) and w and all(_is_int(t) and t >= 0 for t in w)
                    for w in self.bad_words_token_ids)),
             "bad_words_token_ids must be None or a list of non-empty lists of token ids"),
            ("logit_bias", self.logit_bias is None or (
                isinstance(self.logit_bias, Mapping)
                and all(_is_number(b) for b in self.logit_bias.values())),
             "logit_bias must be None or a dict of token id -> finite float bias"),
            ("allowed_token_ids", self.allowed_token_ids is None or (
                isinstance(self.allowed_token_ids, tuple)
                and all(_is_int(t) for t in self.allowed_token_ids)),
             "allowed_token_ids must be None or a list of token ids"),
            ("allowed_token_ids", self.allowed_token_ids is None or len(self.allowed_token_ids) > 0,
             "allowed_token_ids is not None and empty!"),
            ("truncate_prompt_tokens", self.truncate_prompt_tokens is None or (
                _is_int(self.truncate_prompt_tokens)
                and (self.truncate_prompt_tokens >= 1 or self.truncate_prompt_tokens == -1)),
             "truncate_prompt_tokens must be None, -1 (max_model_len) or at least 1"),
            ("extra_args", self.extra_args is None or (
                isinstance(self.extra_args, dict) and _is_json_like(self.extra_args)),
             "extra_args must be None or a dict with string keys and JSON-like values (None, "
             f"bool, 64-bit int, finite float, str, and lists / dicts of them, nested at most "
             f"{_MAX_DEPTH} deep)"),
            ("output_kind", isinstance(self.output_kind, RequestOutputKind),
             "output_kind must be a RequestOutputKind (CUMULATIVE, DELTA or FINAL_ONLY)"),
            *[(name, isinstance(getattr(self, name), bool), f"{name} must be True or False")
              for name in ("ignore_eos", "detokenize", "skip_special_tokens",
                           "spaces_between_special_tokens", "include_stop_str_in_output")],
            ("n", not (self.is_greedy and _is_int(self.n) and self.n > 1),
             "n must be 1 when using greedy sampling"),
        ]

    @property
    def is_greedy(self) -> bool:
        return _is_number(self.temperature) and self.temperature < _SAMPLING_EPS

    @property
    def all_stop_token_ids(self) -> frozenset[int]:
        """The stop tokens min_tokens masks, besides the model's EOS (which the engine adds,
        ignore_eos or not, as vLLM does)."""
        return frozenset(self.stop_token_ids)

    @property
    def output_text_buffer_length(self) -> int:
        """Characters held back from streamed text until stop strings are ruled out."""
        if self.stop and not self.include_stop_str_in_output:
            return max(len(s) for s in self.stop) - 1
        return 0


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


def _int_keys(bias: Mapping) -> Mapping[int, float]:
    """logit_bias with int keys ("12" from JSON becomes 12); a key that is no integer is
    refused naming logit_bias."""
    out = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias keys must be token ids (integers), got {key!r}. "
                             "(SamplingParams.logit_bias)") from None
        if isinstance(key, bool) or (isinstance(key, float) and key != token):
            raise ValueError(f"logit_bias keys must be token ids (integers), got {key!r}. "
                             "(SamplingParams.logit_bias)")
        out[token] = value
    return out


def _plain_copy(value: object, depth: int = 0) -> object:
    """A deep copy of JSON-like data: mappings as dicts, lists and tuples as lists (what
    MessagePack gives back), anything else (or deeper than validation allows) as it is."""
    if depth > _MAX_DEPTH:
        return value
    if isinstance(value, Mapping):
        return {k: _plain_copy(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_copy(v, depth + 1) for v in value]
    return value


def _is_json_like(value: object, depth: int = 0) -> bool:
    """None, bool, a 64-bit int, a finite float, str, or a list / str-keyed dict of those."""
    if depth > _MAX_DEPTH:
        return False
    if value is None or isinstance(value, bool | str):
        return True
    if isinstance(value, int):
        return SEED_MIN <= value <= SEED_MAX
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_is_json_like(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json_like(v, depth + 1) for k, v in value.items())
    return False


def _optional_k(x: object) -> bool:
    return x is None or (_is_int(x) and (x >= 0 or x == -1))


def _in(x: object, lo: float, hi: float) -> bool:
    return _is_number(x) and lo <= x <= hi


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return (isinstance(x, int | float) and not isinstance(x, bool)) and math.isfinite(x)


def asks(params: SamplingParams, name: str) -> bool:
    """Whether `params` asks for something with field `name`: a value other than the field's
    default (None and an empty list or dict ask nothing)."""
    value = getattr(params, name, None)
    if value is None or (isinstance(value, tuple | list | dict | str) and not value):
        return False
    field = type(params).__dataclass_fields__.get(name)
    return field is None or field.default is MISSING or value != field.default
