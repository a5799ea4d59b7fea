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
`tokenizer.decode(output_ids, skip_special_tokens=...)` for any split of the tokens into steps,
except at the end, as in vLLM: text that still ends in U+FFFD (bytes of a character that never
completed) is never emitted, so a request that finishes mid-character ends without them
(a U+FFFD followed by more text stays). The text of a stop token (EOS, stop_token_ids) that
finished the request is left out unless include_stop_str_in_output.

Logprob entries are decoded apart from the text (`decode_logprob_tokens`): each token alone,
then, for one that is only part of a character, with the request's preceding tokens as context
(vLLM's LogprobsProcessor).
"""

from __future__ import annotations

import json
import logging
from bisect import bisect_left
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lab.core.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_REPLACEMENT = "\ufffd"  # what an incomplete UTF-8 sequence decodes to
# Tokens of the prompt's tail the slow path decodes as context (vLLM: 5, plus 2 for specials).
_PREFIX_WINDOW = 5
# Preceding tokens a logprob entry's U+FFFD text is corrected with (vLLM: 4, a UTF-8 sequence).
_MAX_LOGPROB_CONTEXT = 4
# Where the leading-space marker of a tokenizer is cached on it.
_MARKER_CACHE = "_lab_leading_space_marker"
_UNSET = object()
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


def _leading_space_marker(hf) -> str | None:
    """The replacement character of a Metaspace (SentencePiece-style) pre-tokenizer, whose
    leading instance `decode` strips from a lone token; None for other tokenizers (byte-level
    BPE, WordPiece, slow ones), whose single-token decode keeps its spaces. Read once from the
    backend's config and cached on the tokenizer (vLLM's `get_leading_space_marker`)."""
    cached = getattr(hf, _MARKER_CACHE, _UNSET)
    if cached is not _UNSET:
        return cached
    marker = None
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is not None:
        try:
            pre = json.loads(backend.to_str()).get("pre_tokenizer") or {}
        except Exception:  # a backend that cannot serialize itself: no marker known
            pre = {}
        subs = (pre.get("pretokenizers") or []) if pre.get("type") == "Sequence" else [pre]
        for sub in subs:
            if (sub or {}).get("type") == "Metaspace":
                marker = sub.get("replacement", "\u2581")
                break
    try:
        setattr(hf, _MARKER_CACHE, marker)
    except AttributeError:
        pass
    return marker


def _decode_ids(hf, ids: Sequence[int]) -> str:
    """`decode(ids)` as vLLM's logprob code calls it: special tokens kept; ids the tokenizer
    cannot take at all (negative) read as "" instead of raising."""
    try:
        return hf.decode(list(ids)) or ""
    except (OverflowError, TypeError):
        return ""


def decode_logprob_token(tokenizer, token_id: int) -> str:
    """The text of one token on its own, as a logprob entry shows it before any UTF-8
    correction (vLLM's `convert_ids_list_to_tokens`): `decode([token_id])` with special tokens
    kept; for a SentencePiece-style tokenizer the leading spaces that decode strips from a lone
    token (its leading "\u2581" markers) are put back. "" for an id the tokenizer does not know.
    A byte-level token that is only part of a character decodes to "\ufffd" here;
    `decode_logprob_tokens` corrects that with the request's preceding tokens."""
    hf = _hf(tokenizer)
    text = _decode_ids(hf, [int(token_id)])
    marker = _leading_space_marker(hf)
    if marker is None:
        return text
    try:
        raw = hf.convert_ids_to_tokens(int(token_id))
    except (OverflowError, TypeError):
        raw = None
    if not raw:
        return text
    markers = len(raw) - len(raw.lstrip(marker))
    missing = markers - (len(text) - len(text.lstrip(" ")))
    return " " * missing + text if missing > 0 else text


def _correct_decoded_token(hf, token_id: int, context_token_ids: Sequence[int]) -> str:
    """The text of a token whose lone decode ends in U+FFFD (a byte of a multi-byte character),
    decoded after the last 1..4 context tokens (vLLM's `_correct_decoded_token`): with the
    fewest context tokens whose joint decode no longer ends in U+FFFD, the text past the clean
    context (the context tokens before its own trailing run of lone-U+FFFD tokens, whose bytes
    this token completes and so are attributed to it). "" when no context completes it (the
    character is still unfinished, or there is no context)."""
    context_token_ids = list(context_token_ids)
    for num_ctx in range(1, min(len(context_token_ids), _MAX_LOGPROB_CONTEXT) + 1):
        context = context_token_ids[-num_ctx:]
        full = _decode_ids(hf, [*context, token_id])
        if full.endswith(_REPLACEMENT):
            continue
        clean_end = len(context)
        while clean_end > 0 and _decode_ids(hf, [context[clean_end - 1]]).endswith(_REPLACEMENT):
            clean_end -= 1
        clean_prefix = _decode_ids(hf, context[:clean_end]) if clean_end else ""
        if full.startswith(clean_prefix):
            return full[len(clean_prefix):]
        # normalization changed the prefix: cut at the longest common prefix instead
        common = 0
        for a, b in zip(clean_prefix, full, strict=False):
            if a != b:
                break
            common += 1
        return full[common:]
    return ""


def decode_logprob_tokens(
    tokenizer, token_ids_at_position: Sequence[int], context_token_ids: Sequence[int],
    cache: dict[int, str] | None = None,
) -> list[str]:
    """The decoded_token of each logprob entry at one position (the position's own token, then
    its top-k alternatives), as vLLM's LogprobsProcessor gives them: each token decoded alone
    (`decode_logprob_token`); one whose text ends in U+FFFD is redone with the request's
    preceding tokens as context (`_correct_decoded_token`): "" while its character is still
    unfinished, the completed character once it completes one.

    `context_token_ids` are the own tokens of the request's previous positions, oldest first
    (the sampled tokens for sample logprobs, the prompt tokens for prompt logprobs); only the
    last 4 are used (the longest UTF-8 sequence). `cache` (token id -> its lone text, owned
    by the caller, e.g. one per OutputProcessor) saves the tokenizer call for tokens seen
    before: a lone token's text never changes, and logprobs decode k + 1 tokens per position."""
    hf = _hf(tokenizer)
    context = [int(t) for t in context_token_ids[-_MAX_LOGPROB_CONTEXT:]]
    texts = []
    for token_id in token_ids_at_position:
        text = None if cache is None else cache.get(token_id)
        if text is None:
            text = decode_logprob_token(hf, token_id)
            if cache is not None:
                cache[token_id] = text
        if text.endswith(_REPLACEMENT):
            text = _correct_decoded_token(hf, int(token_id), context)
        texts.append(text)
    return texts


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
    """What both decoding strategies share: appending decoded text, the stop-string check and
    the streamed hold-back. Subclasses say how one token is decoded (`_decode_next`)."""

    def __init__(self, params: SamplingParams) -> None:
        super().__init__()
        self.stop: tuple[str, ...] = tuple(params.stop or ())
        self.min_tokens: int = params.min_tokens
        self.include_stop_str_in_output: bool = params.include_stop_str_in_output
        self.skip_special_tokens: bool = params.skip_special_tokens
        self.stop_buffer_length: int = params.output_text_buffer_length
        self.stopped_by_string = False  # a stop string cut the text: nothing more is added
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
        once finished, nothing is. Bytes of a character that never completed are not text
        (vLLM): a request that ends mid-character ends without them, not with U+FFFD."""
        hold = 0 if finished else self.stop_buffer_length
        end = max(len(self.output_text) - hold, 0)
        if not delta:
            return self.output_text[:end] if hold else self.output_text
        start = self._last_output_text_offset
        if start >= end:
            return ""
        self._last_output_text_offset = end
        return self.output_text[start:end]

    def _decode_next(self, token_id: int) -> str:
        """The text one more token adds ("" while it only adds bytes of an unfinished
        character)."""
        raise NotImplementedError


class FastIncrementalDetokenizer(_TextDetokenizer):
    """Decodes with tokenizers' DecodeStream on the fast tokenizer's Rust backend, primed with
    the whole prompt so the first output token decodes in context (vLLM's fast path, as is:
    a prompt given as ids that ends inside a character has that character completed, and
    emitted, by the output tokens that finish it)."""

    def __init__(self, tokenizer, prompt_token_ids: list[int],
                 params: SamplingParams) -> None:
        super().__init__(params)
        hf = _hf(tokenizer)
        self.backend = hf.backend_tokenizer
        self._stream_class = _decode_stream_class()
        self.stream = self._new_stream(prompt_token_ids)
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
            text = self._step(self.stream, token_id)
        if self._added:
            content = self._added.get(token_id)
            if content is not None and self._last_added:
                text = content
            self._last_added = content is not None
        return text or ""


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
        # the prompt's last few tokens as context, whatever they end with (vLLM)
        context = prompt_token_ids[-_PREFIX_WINDOW - 2:]
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


__all__ = [
    "FastIncrementalDetokenizer",
    "IncrementalDetokenizer",
    "SlowIncrementalDetokenizer",
    "check_stop_strings",
    "decode_logprob_token",
    "decode_logprob_tokens",
]
