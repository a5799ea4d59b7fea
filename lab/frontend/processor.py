"""Processor: where a request enters the engine (vLLM V1's InputProcessor).

It validates everything about the request that depends on the model (token ids inside the
vocabulary, logprobs against `max_logprobs`, bad words that tokenize, what each configured
logits processor accepts), tokenizes the prompt, applies `truncate_prompt_tokens`, and builds
the `EngineCoreRequest`. A bad request raises ValueError / TypeError naming the field and what
is allowed; nothing has been queued then.

A parameter that only a logits processor implements (`LogitsProcessor.implements`: min_tokens,
logit_bias, penalties, ...) is refused when the engine does not list that processor
(`logits_processors=[penalties]` drops the others), naming the processor's option and how to
list it, instead of being ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from hydra.utils import get_class
from omegaconf import OmegaConf

from lab.config.plugins import option_files
from lab.core.model_info import ModelInfo
from lab.core.protocol import EngineCoreRequest
from lab.core.sampling_params import (
    MAX_NUM_BAD_WORDS,
    SamplingParams,
    as_sampling_params,
    asks,
)
from lab.frontend.tokenizer import Tokenizer


@dataclass(frozen=True)
class ProcessedRequest:
    """A validated request: the prompt as given (text or None), its token ids (truncated if
    asked) and the params the core runs (bad words resolved to token ids)."""

    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams


class Processor:
    """Validates and tokenizes requests for one engine's model."""

    def __init__(
        self, tokenizer: Tokenizer | None, model_info: ModelInfo, max_model_len: int,
        max_logprobs: int, logits_processors: Sequence[object] = (),
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = model_info.vocab_size
        self.eos_token_id = model_info.eos_token_id
        self.max_model_len = max_model_len
        self.max_logprobs = max_logprobs
        # the configured processors' classes (their validate_params), from classes, instances
        # or partials
        self.processor_classes = [_class_of(p) for p in logits_processors]
        # SamplingParams field -> (option, class) of a logits_processors option that implements
        # it, for the fields no configured processor implements (requests setting them refused)
        listed = {name for cls in self.processor_classes
                  for name in getattr(cls, "implements", ())}
        self.unserved = {name: owner for name, owner in group_implementers().items()
                         if name not in listed}

    def process(self, prompt: object, params: object) -> ProcessedRequest:
        text = prompt if isinstance(prompt, str) else None
        params = SamplingParams() if params is None else as_sampling_params(params)
        ids = self._validate_prompt(self._encode(prompt) if text is not None else prompt)
        ids = self._truncate(ids, params.truncate_prompt_tokens)
        params = self._validate_params(params)
        return ProcessedRequest(text, ids, params)

    def core_request(
        self, request_id: str, processed: ProcessedRequest, params: SamplingParams,
        arrival_time: float, priority: int, client_id: str | None,
    ) -> EngineCoreRequest:
        return EngineCoreRequest(request_id, processed.prompt_token_ids, params,
                                 self.eos_token_id, arrival_time, priority, client_id)

    # -- prompt --------------------------------------------------------------------------------
    def _encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this engine's model has no tokenizer (a config-only model under "
                             "executor=sim): give prompts as lists of token ids")
        return self.tokenizer.encode(prompt)

    def _validate_prompt(self, ids: object) -> list[int]:
        if isinstance(ids, str | bytes) or not isinstance(ids, Sequence):
            raise TypeError(f"a prompt must be a string or a list of token ids, not "
                            f"{type(ids).__name__}")
        ids = list(ids)
        if not ids:
            raise ValueError("prompt is empty: give at least one token")
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 or t >= self.vocab_size
               for t in ids):
            raise ValueError(f"prompt token ids must be integers in [0, {self.vocab_size})")
        return ids

    def _truncate(self, ids: list[int], k: int | None) -> list[int]:
        """Keep the last k tokens (-1: max_model_len - 1, the most a prompt can have); then a
        prompt must leave room for one output token."""
        if k is not None:
            ids = ids[-(self.max_model_len - 1 if k == -1 else k):]
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(ids)} tokens but max_model_len={self.max_model_len} leaves no "
                "room for an output token; shorten the prompt (or set truncate_prompt_tokens) "
                "or raise max_model_len")
        return ids

    # -- params --------------------------------------------------------------------------------
    def _validate_params(self, params: SamplingParams) -> SamplingParams:
        self._check_logprobs(params.logprobs, "logprobs", "sample")
        self._check_logprobs(params.prompt_logprobs, "prompt_logprobs", "prompt")
        self._check_vocab(params.stop_token_ids, "stop_token_ids")
        self._check_vocab(params.logit_bias or (), "logit_bias")
        if params.allowed_token_ids is not None:
            bad = [t for t in params.allowed_token_ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"allowed_token_ids contains out-of-vocab token id! {bad} "
                                 f"(vocabulary size {self.vocab_size}). "
                                 "(SamplingParams.allowed_token_ids)")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need the model's tokenizer to detokenize, and this "
                             "model has none: use stop_token_ids. (SamplingParams.stop)")
        if params.bad_words:
            params = replace(params, bad_words_token_ids=self._bad_words_ids(params.bad_words))
        elif params.bad_words_token_ids is not None:
            for word in params.bad_words_token_ids:
                self._check_vocab(word, "bad_words_token_ids")
        self._check_served(params)
        for cls in self.processor_classes:
            cls.validate_params(params)
        return self._bound(params)

    def _check_served(self, params: SamplingParams) -> None:
        """Refuse a parameter whose logits processor this engine does not run."""
        for name, (option, cls) in self.unserved.items():
            if not asks(params, name):
                continue
            running = ", ".join(c.__name__ for c in self.processor_classes) or "none"
            raise ValueError(
                f"{name}={getattr(params, name)!r} needs the logits processor {option!r} "
                f"({cls.__module__}.{cls.__qualname__}), which this engine does not run (it "
                f"runs: {running}): list it, e.g. logits_processors=[...,{option}] (the default "
                f"list has every built-in). (SamplingParams.{name})")

    def _bound(self, params: SamplingParams) -> SamplingParams:
        """Cap the counts that may be larger than anything the model can use — top_k beyond
        the vocabulary, max_tokens / min_tokens beyond max_model_len — which changes no output
        and keeps every request within 64-bit integers, so it can cross to an engine-core
        process (msgpack) and into the step's int64 tensors (top_k=10**30 made a 500 there)."""
        caps = {"top_k": self.vocab_size, "max_tokens": self.max_model_len,
                "min_tokens": self.max_model_len}
        over = {k: cap for k, cap in caps.items()
                if getattr(params, k) is not None and getattr(params, k) > cap}
        if not over:
            return params
        if "min_tokens" in over and "max_tokens" not in over and params.max_tokens is not None:
            over["min_tokens"] = min(over["min_tokens"], params.max_tokens)
        return replace(params, **over)

    def _check_logprobs(self, k: int | None, name: str, kind: str) -> None:
        if k is None or self.max_logprobs == -1:
            return
        num = self.vocab_size if k == -1 else k
        if num > self.max_logprobs:
            raise ValueError(f"Requested {kind} logprobs of {num}, which is greater than max "
                             f"allowed: {self.max_logprobs} (the engine knob max_logprobs). "
                             f"(SamplingParams.{name})")

    def _check_vocab(self, token_ids, name: str) -> None:
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token_id(s) {bad} in {name} contain out-of-vocab token ids. "
                             f"Vocabulary size: {self.vocab_size}. (SamplingParams.{name})")

    def _bad_words_ids(self, bad_words: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
        """vLLM's rule: each word as it is (leading spaces stripped) and, when that makes a
        different token sequence of the same length, with a leading space (so it is banned at
        the start of the text and in the middle)."""
        if self.tokenizer is None:
            raise ValueError("bad_words need the model's tokenizer, and this model has none: "
                             "set bad_words_token_ids. (SamplingParams.bad_words)")
        words: list[tuple[int, ...]] = []
        for word in bad_words:
            plain = tuple(self.tokenizer.encode_plain(word.lstrip()))
            if not plain:
                raise ValueError(f"bad_words entries must tokenize to at least one token, "
                                 f"got {word!r}. (SamplingParams.bad_words)")
            words.append(plain)
            spaced = tuple(self.tokenizer.encode_plain(" " + word.lstrip()))
            if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
                words.append(spaced)
            if len(words) > MAX_NUM_BAD_WORDS:
                raise ValueError(f"Too many bad words after tokenization: {len(words)}. The max "
                                 f"number is {MAX_NUM_BAD_WORDS}. (SamplingParams.bad_words)")
        for word in words:
            self._check_vocab(word, "bad_words")
        return tuple(words)


def group_implementers() -> dict[str, tuple[str, type]]:
    """SamplingParams field -> (option, class) over the options of the logits_processors group
    (lab's and installed plug-ins'), from each class's `implements`."""
    owners: dict[str, tuple[str, type]] = {}
    for path in option_files("logits_processors"):
        cls = get_class(OmegaConf.load(path)["_target_"])
        for name in getattr(cls, "implements", ()):
            owners.setdefault(name, (path.stem, cls))
    return owners


def _class_of(processor: object) -> type:
    """The class behind a processor instance, class, or Hydra partial of one."""
    func = getattr(processor, "func", processor)
    return func if isinstance(func, type) else type(func)
