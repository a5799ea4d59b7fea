"""Incremental detokenization and stop strings, per request (vLLM V1's `IncrementalDetokenizer`).

The engine's output processor builds one detokenizer per request with
`IncrementalDetokenizer.from_new_request(tokenizer, prompt_token_ids, params)` and, every step,
calls `update(new_token_ids, stop_terminated)`: the new tokens are decoded into `output_text`
and the stop strings are looked for in the text they produced. A matched stop string is
returned (the caller finishes the request with it as stop_reason) and the text is cut as
vLLM cuts it. `get_next_output_text(finished, delta)` is what a RequestOutput carries: it holds
back the last `params.output_text_buffer_length` characters while the request runs, so that a
stop string that has only begun is never streamed and then cut.

Decoding is incremental so a step costs O(new tokens), not O(output): the fast path steps
tokenizers' `DecodeStream` (Rust; it buffers the bytes of a UTF-8 character split over several
byte-level tokens until the character is complete), the fallback is the prefix/read-offset
algorithm of vLLM's slow path (decode a small window, emit what it added past the previous
window, hold back text that ends in U+FFFD). Either way the concatenated text equals
`tokenizer.decode(output_ids, skip_special_tokens=...)` for any split of the tokens into steps.

One deliberate difference from vLLM: when the request finishes, bytes still waiting for the rest
of their character are flushed (decoded as U+FFFD, as `decode` does) instead of dropped, so the
final text equals the full decode of the output; a request cut by a stop string flushes nothing.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lab.sampling.params import SamplingParams

logger = logging.getLogger(__name__)

_REPLACEMENT = "\ufffd"  # what an incomplete UTF-8 sequence decodes to
# Tokens of the prompt's tail the slow path decodes as context (vLLM: 5, plus 2 for specials).
_PREFIX_WINDOW = 5
# The Rust error DecodeStream raises when its state no longer prefixes the decoded text.
_INVALID_PREFIX = "Invalid prefix encountered"


def _hf(tokenizer):
    """The transformers tokenizer behind lab's wrapper (a bare one is accepted as is)."""
    return getattr(tokenizer, "hf", tokenizer)


def _decode_stream_class():
    """tokenizers' DecodeStream (tokenizers >= 0.21), or None where it is missing."""
    try:
        from tokenizers.decoders import DecodeStream
    except ImportError:
        return None
    return DecodeStream


def _prompt_context(tokenizer, prompt_token_ids: Sequence[int], skip_special_tokens: bool):
    """The prompt's last few tokens, as decoding context for the first output tokens, minus
    trailing tokens that leave a character unfinished: a prompt cut mid-character (ids, not
    text) must not have its dangling bytes emitted as output text, whose full decode shows
    them as U+FFFD instead."""
    tail = list(prompt_token_ids[-_PREFIX_WINDOW - 2:])
    while tail and _hf(tokenizer).decode(
            tail, skip_special_tokens=skip_special_tokens).endswith(_REPLACEMENT):
        tail.pop()
    return tail


def decode_logprob_token(tokenizer, token_id: int) -> str:
    """The text a logprob entry shows for one token (vLLM's `decoded_token`): the token's
    vocabulary string turned into text on its own; "" for an id the tokenizer does not know."""
    hf = _hf(tokenizer)
    token = hf.convert_ids_to_tokens(int(token_id))
    if token is None:
        return ""
    return hf.convert_tokens_to_string([token])


def check_stop_strings(
    output_text: str, new_char_count: int, stop: Sequence[str], include_in_output: bool
) -> tuple[str, int] | None:
    """The stop string that the last `new_char_count` characters of `output_text` complete, and
    where to cut the text: (stop string, length to truncate to; -1 = keep it all), or None.

    Only matches that end in the new characters are looked for (the text before them was checked
    when it was new), so each stop string is searched from len(stop) - 1 characters before the
    new text: a match spanning token boundaries is found. When several match (several tokens in
    one step), the one that ends first wins, ties going to the earlier in `stop`, so the result
    is the same as feeding one token at a time. The cut keeps the stop string when
    `include_in_output`, else ends where the stop string starts."""
    if new_char_count <= 0 or not stop:
        return None
    text_len = len(output_text)
    best: tuple[int, int, str] | None = None  # (end, start, stop string)
    for stop_str in stop:
        start = output_text.find(stop_str, max(0, text_len - new_char_count - len(stop_str) + 1))
        if start == -1:
            continue
        end = start + len(stop_str)
        if best is None or end < best[0]:
            best = (end, start, stop_str)
    if best is None:
        return None
    end, start, stop_str = best
    if not include_in_output:
        return stop_str, start
    return stop_str, (-1 if end >= text_len else end)


class IncrementalDetokenizer:
    """A request's output tokens, without text: what a request gets when it asks for no
    detokenization (detokenize=False) or the engine has no tokenizer. `output_text` stays "",
    `update` never matches a stop string. The subclasses decode."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.output_text: str = ""

    @property
    def output_token_ids(self) -> list[int]:
        """The request's output tokens so far (after a stop string: up to the token that
        completed it)."""
        return self.token_ids

    def num_output_tokens(self) -> int:
        """How many output tokens the request has."""
        return len(self.token_ids)

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Append this step's tokens; no text, so no stop string can match."""
        self.token_ids.extend(new_token_ids)
        return None

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """No text: always ""."""
        return ""

    @classmethod
    def from_new_request(
        cls,
        tokenizer,
        prompt_token_ids: Sequence[int] | None,
        params: SamplingParams,
        *,
        use_decode_stream: bool | None = None,
    ) -> IncrementalDetokenizer:
        """The detokenizer for a new request: the no-op one without a tokenizer or with
        params.detokenize False; else DecodeStream's on a fast tokenizer (where tokenizers has
        it), else the slow algorithm. `use_decode_stream` forces a choice (tests; False always
        works)."""
        if tokenizer is None or not params.detokenize:
            return IncrementalDetokenizer()
        prompt = list(prompt_token_ids or ())
        if use_decode_stream is None:
            use_decode_stream = (_decode_stream_class() is not None
                                 and getattr(_hf(tokenizer), "is_fast", False))
        if use_decode_stream:
            return FastIncrementalDetokenizer(tokenizer, prompt, params)
        return SlowIncrementalDetokenizer(tokenizer, prompt, params)


class _TextDetokenizer(IncrementalDetokenizer):
    """What both decoding strategies share: appending decoded text, the stop-string check, the
    streamed hold-back and the flush of an incomplete character at the end. Subclasses say how
    one token is decoded (`_decode_next`) and what undecoded bytes read as (`_pending_text`)."""

    def __init__(self, params: SamplingParams) -> None:
        super().__init__()
        self.stop: tuple[str, ...] = tuple(params.stop or ())
        self.min_tokens: int = params.min_tokens
        self.include_stop_str_in_output: bool = params.include_stop_str_in_output
        self.skip_special_tokens: bool = params.skip_special_tokens
        self.stop_buffer_length: int = params.output_text_buffer_length
        self.stopped_by_string = False  # a stop string cut the text: nothing more is added
        self._flushed = False
        self._last_output_text_offset = 0  # how much text get_next_output_text(delta) gave

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Decode this step's tokens and check the stop strings in the text they added.

        With stop_terminated (the last token is a stop token / EOS) that token is kept in the
        ids but its text is left out unless include_stop_str_in_output, as vLLM does. Stop
        strings are looked for only once more than min_tokens tokens were generated, in the
        text of tokens from the min_tokens-th on. On a match the text is cut, the tokens after
        the one that completed the stop string are dropped, and the stop string is returned."""
        if not new_token_ids or self.stopped_by_string:
            return None
        decode_ids = list(new_token_ids)
        skipped = None
        if stop_terminated and not self.include_stop_str_in_output:
            skipped = decode_ids.pop()

        num_prev = self.num_output_tokens()
        # offsets[i]: the text's length before the i-th new token (and after the last one)
        offsets = [len(self.output_text)]
        for token_id in decode_ids:
            self.token_ids.append(token_id)
            self.output_text += self._decode_next(token_id)
            offsets.append(len(self.output_text))
        if skipped is not None:
            self.token_ids.append(skipped)
            offsets.append(len(self.output_text))

        if not self.stop or self.num_output_tokens() <= self.min_tokens:
            return None
        check_from = offsets[max(self.min_tokens - num_prev, 0)]
        match = check_stop_strings(self.output_text, len(self.output_text) - check_from,
                                   self.stop, self.include_stop_str_in_output)
        if match is None:
            return None
        stop_str, truncate_to = match
        self.stopped_by_string = True
        match_end = len(self.output_text) if truncate_to == -1 else truncate_to
        if not self.include_stop_str_in_output:
            match_end += len(stop_str)
        # the first new token whose text reaches the match's end completed it
        kept = bisect_left(offsets, match_end, lo=1)
        del self.token_ids[num_prev + kept:]
        if truncate_to != -1:
            self.output_text = self.output_text[:truncate_to]
        return stop_str

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """The text a RequestOutput carries: all of it (delta=False) or what earlier delta
        calls did not return (delta=True). While not finished, the last stop_buffer_length
        characters are held back (they may be the start of a stop string that will be cut);
        once finished, nothing is, and a trailing incomplete character is flushed."""
        if finished:
            self._flush()
        hold = 0 if finished else self.stop_buffer_length
        end = max(len(self.output_text) - hold, 0)
        if not delta:
            return self.output_text[:end] if hold else self.output_text
        start = self._last_output_text_offset
        if start >= end:
            return ""
        self._last_output_text_offset = end
        return self.output_text[start:end]

    def _flush(self) -> None:
        """Once, at the end: add the text of bytes that never completed a character (U+FFFD,
        as the full decode shows them), unless a stop string ended the text."""
        if self._flushed:
            return
        self._flushed = True
        if not self.stopped_by_string:
            self.output_text += self._pending_text()

    def _decode_next(self, token_id: int) -> str:
        """The text one more token adds ("" while it only adds bytes of an unfinished
        character)."""
        raise NotImplementedError

    def _pending_text(self) -> str:
        """The text of the tokens `_decode_next` has not emitted yet, decoded as they are."""
        raise NotImplementedError


class FastIncrementalDetokenizer(_TextDetokenizer):
    """Decodes with tokenizers' DecodeStream on the fast tokenizer's Rust backend, primed with
    the prompt so the first output token decodes in context (vLLM's fast path)."""

    def __init__(self, tokenizer, prompt_token_ids: list[int],
                 params: SamplingParams) -> None:
        super().__init__(params)
        hf = _hf(tokenizer)
        self.backend = hf.backend_tokenizer
        self._stream_class = _decode_stream_class()
        context = _prompt_context(hf, prompt_token_ids, params.skip_special_tokens)
        self.stream = self._new_stream(context)
        self._context_id: int | None = context[-1] if context else None
        self._pending: list[int] = []  # tokens stepped since the stream last produced text
        # DecodeStream knows nothing of spaces_between_special_tokens; as vLLM, when it is off
        # (and specials are kept) an added token right after another shows as its bare content.
        self._added: dict[int, str] = {}
        if not (params.skip_special_tokens or params.spaces_between_special_tokens):
            self._added = {i: t.content
                           for i, t in self.backend.get_added_tokens_decoder().items()}
        self._last_added = False

    def _new_stream(self, prompt_token_ids: Sequence[int] = ()):
        """A DecodeStream primed with the prompt's context (tokenizers >= 0.22 take `ids`; older
        ones are primed by stepping it and discarding the text)."""
        skip = self.skip_special_tokens
        if not prompt_token_ids:
            return self._stream_class(skip_special_tokens=skip)
        try:
            return self._stream_class(ids=list(prompt_token_ids), skip_special_tokens=skip)
        except TypeError:
            stream = self._stream_class(skip_special_tokens=skip)
            for token_id in prompt_token_ids:
                self._step(stream, token_id)
            return stream

    def _step(self, stream, token_id: int) -> str | None:
        """One DecodeStream step; an id it cannot take (negative, too large for it) adds
        nothing, as in vLLM."""
        try:
            return stream.step(self.backend, token_id)
        except (OverflowError, TypeError):
            logger.warning("token id %r cannot be decoded; it adds no text", token_id)
            return None

    def _decode_next(self, token_id: int) -> str:
        """Step the stream; if its state broke (a tokenizer that decodes to invalid UTF-8 that
        a later token rewrites) restart it without context, as vLLM does."""
        try:
            text = self._step(self.stream, token_id)
        except Exception as e:
            if not str(e).startswith(_INVALID_PREFIX):
                raise
            logger.warning("DecodeStream lost its prefix; restarting it at token %d", token_id)
            self.stream = self._new_stream()
            self._pending = []
            text = self._step(self.stream, token_id)
        if self._added:
            content = self._added.get(token_id)
            if content is not None and self._last_added:
                text = content
            self._last_added = content is not None
        if text is None:
            self._pending.append(token_id)
            return ""
        self._pending = []
        self._context_id = token_id
        return text

    def _pending_text(self) -> str:
        """Decode the unemitted tokens after the last emitting one (as context, so a decoder
        that strips a leading space does not)."""
        if not self._pending:
            return ""
        skip = self.skip_special_tokens
        if self._context_id is None:
            return self.backend.decode(self._pending, skip_special_tokens=skip)
        prefix = self.backend.decode([self._context_id], skip_special_tokens=skip)
        full = self.backend.decode([self._context_id, *self._pending], skip_special_tokens=skip)
        if full.startswith(prefix):
            return full[len(prefix):]
        return self.backend.decode(self._pending, skip_special_tokens=skip)


class SlowIncrementalDetokenizer(_TextDetokenizer):
    """The pure-Python fallback (vLLM's slow path, from text-generation-inference): keep the
    token strings; for each new token decode the window tokens[prefix_offset:] and emit what it
    adds past the text of tokens[prefix_offset:read_offset]; text ending in U+FFFD is held
    back (an unfinished character), and then the window grows until the character completes.
    Decoding a window rather than one token keeps the decoder's context-dependent rules
    (leading spaces, merges) the same as in a full decode."""

    def __init__(self, tokenizer, prompt_token_ids: list[int],
                 params: SamplingParams) -> None:
        super().__init__(params)
        self.hf = _hf(tokenizer)
        self.spaces_between_special_tokens = params.spaces_between_special_tokens
        self._vocab_len = len(self.hf)
        # vLLM decodes added tokens apart from the rest only for slow tokenizers
        self._added_vocab: set[str] = set()
        self._special: set[str] = set()
        if not getattr(self.hf, "is_fast", False):
            self._added_vocab = set(self.hf.get_added_vocab())
            if params.skip_special_tokens:
                self._special = set(self.hf.all_special_tokens)
        context = _prompt_context(self.hf, prompt_token_ids, params.skip_special_tokens)
        self.tokens: list[str] = self._to_tokens(context)
        self.read_offset = len(self.tokens)
        self.prefix_offset = max(self.read_offset - _PREFIX_WINDOW, 0)

    def _to_tokens(self, ids: Sequence[int]) -> list[str]:
        """Vocabulary strings of the ids (special ones dropped when skipped; unknown -> "")."""
        if not ids:
            return []
        tokens: list[str] = []
        for i in ids:  # one by one: skipped specials drop out, unknown ids read as ""
            if 0 <= i < self._vocab_len:
                got = self.hf.convert_ids_to_tokens([i], skip_special_tokens=self.skip_special_tokens)
                tokens.extend(t or "" for t in got)
            else:
                tokens.append("")
        return tokens

    def _to_text(self, tokens: list[str]) -> str:
        """Text of token strings; for a slow tokenizer with added tokens, those are kept
        verbatim and the runs between them decoded apart (joined by a space when
        spaces_between_special_tokens, as transformers' slow decode does)."""
        if not self._added_vocab:
            return self.hf.convert_tokens_to_string(tokens) if tokens else ""
        parts: list[str] = []
        run: list[str] = []
        for token in tokens:
            if token in self._special:
                continue
            if token in self._added_vocab:
                if run:
                    parts.append(self.hf.convert_tokens_to_string(run))
                    run = []
                parts.append(token)
            else:
                run.append(token)
        if run:
            parts.append(self.hf.convert_tokens_to_string(run))
        return (" " if self.spaces_between_special_tokens else "").join(parts)

    def _window_texts(self) -> tuple[str, str]:
        """(text of the already-emitted window, text of the window plus the new tokens)."""
        window = self.tokens[self.prefix_offset:]
        prefix = self._to_text(window[: self.read_offset - self.prefix_offset])
        return prefix, self._to_text(window)

    def _decode_next(self, token_id: int) -> str:
        """Add the token's string and emit the window's new text if it is complete."""
        self.tokens.extend(self._to_tokens([token_id]))
        prefix, full = self._window_texts()
        if len(full) <= len(prefix) or full.endswith(_REPLACEMENT):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.tokens)
        return full[len(prefix):]

    def _pending_text(self) -> str:
        """The window's text past what was emitted, whatever it ends with."""
        prefix, full = self._window_texts()
        return full[len(prefix):] if len(full) > len(prefix) else ""


__all__ = [
    "FastIncrementalDetokenizer",
    "IncrementalDetokenizer",
    "SlowIncrementalDetokenizer",
    "check_stop_strings",
    "decode_logprob_token",
]
