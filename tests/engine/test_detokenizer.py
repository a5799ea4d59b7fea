"""The incremental detokenizer against the tokenizer's full decode, and its stop strings.

Every property runs on both decoding strategies (tokenizers' DecodeStream and the slow
prefix/read-offset fallback) with the tiny_llama byte-level BPE, plus two non-special added
tokens so that added tokens that are not special are exercised too. Texts mix ASCII with
emoji and CJK, whose UTF-8 bytes are split over several byte-level tokens. The logprob-token
decoding (vLLM's `convert_ids_list_to_tokens` and UTF-8 correction) is also checked on a tiny
SentencePiece-style tokenizer (Metaspace, byte fallback) built in memory.

The expected values follow vLLM 0.32; a differential run against vLLM's own detokenizers and
LogprobsProcessor on random inputs (both tokenizers) agreed with them.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lab.core.sampling_params import SamplingParams
from lab.frontend.detokenizer import (
    FastIncrementalDetokenizer,
    IncrementalDetokenizer,
    SlowIncrementalDetokenizer,
    check_stop_strings,
    decode_logprob_token,
    decode_logprob_tokens,
)

# Units texts are built from: ASCII words and whitespace, multi-byte characters (emoji incl. a
# skin-tone modifier sequence, CJK, accented letters) that byte-level BPE splits over tokens.
PIECES = ["a", "b", "ab", " ", "  ", "\n", "\t", "Hello", " the", ".", "x", "<", "|",
          "😀", "🎉", "👍🏽", "漢", "字", "日本語", "é", "ü", "ñ", "café", "–"]
texts = st.lists(st.sampled_from(PIECES), max_size=14).map("".join)
EXTRA = ["<|extra_0|>", "<|extra_1|>"]
BACKENDS = ["fast", "slow"]


@pytest.fixture(scope="module")
def tok():
    """tiny_llama's tokenizer (a fresh copy) with two non-special added tokens."""
    from lab.frontend.tokenizer import load_tokenizer
    from lab.models.tiny import ensure_tiny_model

    tokenizer = load_tokenizer(ensure_tiny_model("tiny_llama"))
    tokenizer.hf.add_tokens(EXTRA)
    return tokenizer


def special_ids(tok) -> list[int]:
    """BOS, EOS, PAD and the added tokens: ids a model may emit anywhere."""
    return sorted(set(tok.hf.all_special_ids) | set(tok.hf.convert_tokens_to_ids(EXTRA)))


def make(tok, prompt, backend, **params) -> IncrementalDetokenizer:
    """A detokenizer for a request with these sampling params on the chosen strategy."""
    detok = IncrementalDetokenizer.from_new_request(
        tok, prompt, SamplingParams(max_tokens=None, **params),
        use_decode_stream=backend == "fast")
    assert isinstance(detok, FastIncrementalDetokenizer if backend == "fast"
                      else SlowIncrementalDetokenizer)
    return detok


@st.composite
def chunked(draw, ids: list[int]) -> list[list[int]]:
    """ids split into consecutive non-empty steps at random cut points."""
    if not ids:
        return []
    cuts = sorted(draw(st.sets(st.integers(1, len(ids) - 1), max_size=len(ids) - 1))
                  if len(ids) > 1 else set())
    bounds = [0, *cuts, len(ids)]
    return [ids[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def stream(detok, chunks, last_stop_terminated=False):
    """Feed the steps as the engine does; (deltas incl. the final one, matched stop string).
    Also checks that the cumulative text is never ahead of what deltas returned."""
    deltas: list[str] = []
    matched = None
    for i, chunk in enumerate(chunks):
        matched = detok.update(chunk, last_stop_terminated and i == len(chunks) - 1)
        if matched is not None:
            break
        deltas.append(detok.get_next_output_text(finished=False, delta=True))
        assert detok.get_next_output_text(finished=False, delta=False) == "".join(deltas)
    deltas.append(detok.get_next_output_text(finished=True, delta=True))
    return deltas, matched


def final_text(full: str) -> str:
    """A finished request's text given the full decode of its output (vLLM): bytes that never
    completed a character (text still ending in U+FFFD) are held back and then dropped, so a
    decode that ends in U+FFFD loses that trailing run; a U+FFFD followed by other text stays,
    and a decode that ends in complete text (emoji, CJK) is kept exactly. The texts here have
    no U+FFFD of their own, and every tiny_llama token whose lone decode has a U+FFFD is
    nothing but that, so the held-back text is exactly that run."""
    return full.rstrip("\ufffd")


def text_offsets(tok, ids) -> list[int]:
    """Length of the complete text after each token (bytes of an unfinished character at the
    end are not text yet): where each token's text ends in the streamed output."""
    return [len(tok.decode(ids[:k + 1]).rstrip("\ufffd")) for k in range(len(ids))]


# ---------------------------------------------------------------- decoding


@pytest.mark.parametrize("backend", BACKENDS)
@given(data=st.data())
def test_deltas_concatenate_to_the_full_decode(tok, backend, data):
    """Any split of the output into steps, with special and added tokens inserted anywhere
    (even between the bytes of one character), output cut anywhere (even inside a character),
    streams exactly decode(output_ids), less a trailing U+FFFD run (`final_text`); no U+FFFD is
    ever streamed unless the final text has it."""
    ids = tok.encode(data.draw(texts, label="text"))
    for _ in range(data.draw(st.integers(0, 3), label="n_special")):
        pos = data.draw(st.integers(0, len(ids)), label="pos")
        ids.insert(pos, data.draw(st.sampled_from(special_ids(tok)), label="special"))
    if data.draw(st.booleans(), label="cut"):
        ids = ids[:data.draw(st.integers(0, len(ids)), label="cut_at")]
    prompt = tok.encode(data.draw(texts, label="prompt"))
    if data.draw(st.booleans(), label="bos"):
        prompt = [tok.bos_token_id, *prompt]
    skip = data.draw(st.booleans(), label="skip_special_tokens")
    spaces = data.draw(st.booleans(), label="spaces_between_special_tokens")
    detok = make(tok, prompt, backend, skip_special_tokens=skip,
                 spaces_between_special_tokens=spaces)
    deltas, matched = stream(detok, data.draw(chunked(ids), label="chunks"))

    full = tok.decode(ids, skip_special_tokens=skip)
    expected = final_text(full)
    assert matched is None
    assert "".join(deltas) == expected == detok.output_text
    assert detok.get_next_output_text(finished=True, delta=False) == expected
    assert detok.output_token_ids == ids
    if "\ufffd" not in expected:
        assert not any("\ufffd" in d for d in deltas)


@pytest.mark.parametrize("backend", BACKENDS)
def test_split_character_is_held_until_complete(tok, backend):
    """Each byte of an emoji as its own step: nothing is streamed until the last byte."""
    ids = tok.encode("a😀")
    detok = make(tok, [], backend)
    out = []
    for token in ids:
        detok.update([token], False)
        out.append(detok.get_next_output_text(finished=False, delta=True))
    assert len(ids) > 2 and out[0] == "a" and out[-1] == "😀" and out[1:-1] == [""] * (len(ids) - 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unfinished_character_is_dropped_at_the_end(tok, backend):
    """Output that ends mid-character: the dangling bytes are never text (vLLM drops them; no
    U+FFFD at the end), not while running, not once finished."""
    ids = tok.encode("ab😀")[:-1]
    assert tok.decode(ids) == "ab\ufffd"
    detok = make(tok, [], backend)
    detok.update(ids, False)
    assert detok.get_next_output_text(finished=False, delta=True) == "ab"
    assert detok.get_next_output_text(finished=True, delta=True) == ""
    assert detok.get_next_output_text(finished=True, delta=False) == "ab" == detok.output_text


@pytest.mark.parametrize("backend", BACKENDS)
def test_replacement_character_in_the_middle_stays(tok, backend):
    """Bytes that can no longer complete a character (an emoji's first byte, then ASCII) are
    text once later text follows them: U+FFFD in the middle stays, as in decode."""
    ids = [*tok.encode("a😀")[:2], *tok.encode("x.")]
    assert tok.decode(ids) == "a\ufffdx."
    detok = make(tok, [], backend)
    deltas, _ = stream(detok, [[t] for t in ids])
    assert "".join(deltas) == "a\ufffdx." == detok.output_text
    # ... but a run that ends the output is still dropped
    detok = make(tok, [], backend)
    deltas, _ = stream(detok, [[t] for t in ids[:2]])
    assert "".join(deltas) == "a"


@pytest.mark.parametrize("backend", BACKENDS)
def test_prompt_cut_mid_character(tok, backend):
    """A prompt (given as ids) that ends inside a character, as vLLM handles it: the fast path
    primes DecodeStream with the whole prompt, so the output token completing the character
    emits it, with the text of its pre-token before it ("x"); the slow path's window counts the
    character as prompt text, so only what follows is output. Either way no U+FFFD."""
    ids = tok.encode("x漢y")
    prompt, output = ids[:2], ids[2:]
    detok = make(tok, prompt, backend)
    deltas, _ = stream(detok, [[t] for t in output])
    assert "".join(deltas) == {"fast": "x漢y", "slow": "y"}[backend]


def test_decode_stream_without_ids_argument(tok, monkeypatch):
    """tokenizers before 0.22 have no DecodeStream(ids=...): the prompt primes it by steps."""
    from tokenizers.decoders import DecodeStream

    import lab.frontend.detokenizer as mod

    def old_stream(skip_special_tokens=False, **kwargs):
        if kwargs:
            raise TypeError("unexpected keyword argument 'ids'")
        return DecodeStream(skip_special_tokens=skip_special_tokens)

    monkeypatch.setattr(mod, "_decode_stream_class", lambda: old_stream)
    ids = tok.encode(" 漢字 😀 done")
    detok = make(tok, tok.encode("Hello 日本"), "fast")
    deltas, _ = stream(detok, [ids[:3], ids[3:]])
    assert "".join(deltas) == tok.decode(ids)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("include", [False, True])
def test_stop_token_text(tok, backend, include):
    """A step that ends with a stop token (EOS): the token stays in the ids; its text is in
    the output only with include_stop_str_in_output (vLLM)."""
    ids = tok.encode("hi 😀")
    eos = tok.eos_token_id
    detok = make(tok, [], backend, skip_special_tokens=False, include_stop_str_in_output=include)
    deltas, matched = stream(detok, [ids[:2], [*ids[2:], eos]], last_stop_terminated=True)
    assert matched is None
    assert "".join(deltas) == tok.decode(ids + [eos] * include, skip_special_tokens=False)
    assert detok.output_token_ids == [*ids, eos]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("include", [False, True])
def test_stop_token_id_text(tok, backend, include):
    """A stop_token_ids token that is ordinary text ("."), alone in its step, finishing the
    request: its text is left out unless include_stop_str_in_output; bytes pending before it
    are dropped either way (the stop token cannot complete them)."""
    ids = tok.encode("hi.")
    dot = ids[-1]
    assert tok.decode([dot]) == "."
    detok = make(tok, [], backend, stop_token_ids=[dot], include_stop_str_in_output=include)
    deltas, _ = stream(detok, [ids[:-1], [dot]], last_stop_terminated=True)
    assert "".join(deltas) == "hi" + "." * include
    assert detok.output_token_ids == ids
    partial = tok.encode("hi😀")[:-1]
    detok = make(tok, [], backend, stop_token_ids=[dot], include_stop_str_in_output=include)
    deltas, _ = stream(detok, [partial, [dot]], last_stop_terminated=True)
    assert "".join(deltas) == "hi" + "\ufffd." * include


def test_no_text_without_tokenizer_or_detokenize(tok):
    """No tokenizer, or detokenize=False: the no-op detokenizer tracks ids and has no text."""
    for detok in (IncrementalDetokenizer.from_new_request(None, [1], SamplingParams()),
                  IncrementalDetokenizer.from_new_request(
                      tok, [1], SamplingParams(detokenize=False))):
        assert type(detok) is IncrementalDetokenizer
        assert detok.update([5, 6], False) is None and detok.update([7], True) is None
        assert detok.output_token_ids == [5, 6, 7] and detok.num_output_tokens() == 3
        assert detok.output_text == ""
        assert detok.get_next_output_text(finished=True, delta=False) == ""


def test_fast_path_is_the_default_for_a_fast_tokenizer(tok):
    """As in vLLM: a fast tokenizer gets DecodeStream."""
    detok = IncrementalDetokenizer.from_new_request(tok, [], SamplingParams())
    assert isinstance(detok, FastIncrementalDetokenizer)


# ---------------------------------------------------------------- stop strings


def reference_stop(text, offsets, stops, min_tokens, include):
    """What the stop check must give for the whole output, however it is split into steps:
    the stop string occurrence that ends first (ties: earlier in `stops`) among those ending
    after the text of the first min_tokens tokens; (stop, text kept, tokens kept) or None."""
    floor = offsets[min_tokens - 1] if min_tokens else 0
    best = None
    for s in stops:
        start = text.find(s, max(0, floor - len(s) + 1))
        if start != -1 and (best is None or start + len(s) < best[1] + len(best[0])):
            best = (s, start)
    if best is None:
        return None
    s, start = best
    end = start + len(s)
    completing = next(k for k, off in enumerate(offsets) if off >= end)
    return s, text[:end] if include else text[:start], completing + 1


@pytest.mark.parametrize("backend", BACKENDS)
@given(data=st.data())
def test_stop_strings(tok, backend, data):
    """Stop strings that span token boundaries (the end of one token's text and the start of
    the next), several of them, min_tokens, include_stop_str_in_output either way, any split
    into steps: the matched string, the cut text and the kept ids are those of the whole-output
    reference, and streamed deltas never show text that the cut later removes (the hold-back
    keeps a stop string's beginning until it is ruled out)."""
    ids = tok.encode(data.draw(texts.filter(lambda t: len(t) >= 2), label="text"))
    text = tok.decode(ids)
    offsets = text_offsets(tok, ids)
    stops = []
    boundaries = sorted({o for o in offsets if 0 < o < len(text)})
    if boundaries:  # one that spans a token boundary
        b = data.draw(st.sampled_from(boundaries), label="boundary")
        before = data.draw(st.integers(1, min(3, b)), label="before")
        after = data.draw(st.integers(1, min(3, len(text) - b)), label="after")
        stops.append(text[b - before:b + after])
    for _ in range(data.draw(st.integers(0 if stops else 1, 2), label="n_more")):
        if data.draw(st.booleans(), label="substring"):
            i = data.draw(st.integers(0, len(text) - 1), label="i")
            stops.append(text[i:i + data.draw(st.integers(1, 4), label="len")])
        else:
            stops.append(data.draw(texts.filter(bool), label="random stop"))
    stops = list(dict.fromkeys(data.draw(st.permutations(stops), label="order")))
    include = data.draw(st.booleans(), label="include")
    min_tokens = data.draw(st.integers(0, len(ids)), label="min_tokens")

    detok = make(tok, tok.encode("Q: "), backend, stop=stops, include_stop_str_in_output=include,
                 min_tokens=min_tokens)
    deltas, matched = stream(detok, data.draw(chunked(ids), label="chunks"))

    expected = reference_stop(text, offsets, stops, min_tokens, include)
    if expected is None:
        assert matched is None
        assert "".join(deltas) == text and detok.output_token_ids == ids
    else:
        stop, kept_text, kept_tokens = expected
        assert matched == stop
        assert "".join(deltas) == kept_text == detok.output_text
        assert detok.output_token_ids == ids[:kept_tokens]
    streamed = ""
    for d in deltas:  # every prefix streamed is a prefix of the final text
        streamed += d
        assert detok.output_text.startswith(streamed)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stop_string_across_tokens_one_step_at_a_time(tok, backend):
    """"lo wo" ends one token and starts the next: found, cut, and never streamed."""
    ids = tok.encode("Hello world, hello")
    detok = make(tok, [], backend, stop=["lo wo"])
    assert detok.stop_buffer_length == 4
    streamed, matched = "", None
    for token in ids:
        matched = detok.update([token], False)
        if matched:
            break
        streamed += detok.get_next_output_text(finished=False, delta=True)
    streamed += detok.get_next_output_text(finished=True, delta=True)
    assert matched == "lo wo" and streamed == "Hel" == detok.output_text
    kept = detok.output_token_ids  # up to the token that completed the stop string
    assert "lo wo" in tok.decode(kept) and "lo wo" not in tok.decode(kept[:-1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_min_tokens_delays_the_stop_check(tok, backend):
    """A stop string inside the first min_tokens tokens' text is not a stop; the next is."""
    ids = tok.encode("ab.ab.ab.")
    offsets = text_offsets(tok, ids)
    first_end = text_offsets(tok, ids).index(3) + 1  # tokens up to the first "ab."
    detok = make(tok, [], backend, stop=["b."], min_tokens=first_end)
    deltas, matched = stream(detok, [[t] for t in ids])
    assert matched == "b." and "".join(deltas) == "ab.a"
    assert offsets[len(detok.output_token_ids) - 1] >= 5


@pytest.mark.parametrize("backend", BACKENDS)
def test_stop_string_before_a_stop_token_in_one_step(tok, backend):
    """As in vLLM, the text of a step that ends with a stop token is still checked: a stop
    string completed earlier in that step wins and the later tokens are dropped."""
    ids = tok.encode("one two three")
    eos = tok.eos_token_id
    detok = make(tok, [], backend, stop=["two"])
    assert detok.update([*ids, eos], True) == "two"
    assert detok.get_next_output_text(finished=True, delta=False) == "one "
    kept = detok.output_token_ids
    assert "two" in tok.decode(kept) and "two" not in tok.decode(kept[:-1])


# ---------------------------------------------------------------- check_stop_strings


def test_check_stop_strings():
    """The pure stop check: new text only (plus a stop string's length - 1 before it), the
    earliest ending match, ties to the earlier stop, vLLM's truncation offsets."""
    assert check_stop_strings("hello world", 0, ["world"], False) is None
    assert check_stop_strings("hello world", 3, [], False) is None
    assert check_stop_strings("hello world", 3, ["xyz"], False) is None
    # spans the old/new boundary: "wo" was old, "rld" new
    assert check_stop_strings("hello world", 3, ["world"], False) == ("world", 6)
    assert check_stop_strings("hello world", 3, ["world"], True) == ("world", -1)
    # entirely in old text: already checked, not looked for again
    assert check_stop_strings("hello world", 3, ["hello"], False) is None
    assert check_stop_strings("hello world!!", 5, ["world"], True) == ("world", 11)
    # two matches in one step: the one that ends first wins, whatever the order
    assert check_stop_strings("abcdef", 6, ["def", "bc"], False) == ("bc", 1)
    assert check_stop_strings("abcdef", 6, ["de", "bcd"], True) == ("bcd", 4)
    # same end: the earlier in the list
    assert check_stop_strings("abcdef", 6, ["cd", "bcd"], False) == ("cd", 2)
    assert check_stop_strings("abcdef", 6, ["bcd", "cd"], False) == ("bcd", 1)
    # new_char_count larger than the text: the whole text is searched
    assert check_stop_strings("ab", 10, ["ab"], False) == ("ab", 0)


# ---------------------------------------------------------------- logprob tokens


@pytest.fixture(scope="module")
def sp_tok():
    """A SentencePiece-style tokenizer: Metaspace pre-tokenizer ("\u2581" marks a space), BPE
    with byte fallback (<0xXX> tokens for what the vocabulary lacks), Llama-2's decoder, which
    strips the leading space of a decode, so that a lone "\u2581the" decodes to "the"."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for c in "\u2581abcdefghijklmnopqrstuvwxyz.":
        vocab[c] = len(vocab)
    merges = [("\u2581", "t"), ("h", "e"), ("\u2581t", "he"), ("\u2581", "\u2581"),
              ("\u2581\u2581", "\u2581")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>",
                                   byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581",
                                                     prepend_scheme="first")
    backend.decoder = decoders.Sequence([
        decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def test_decode_logprob_token(tok):
    """A logprob entry's text before correction: decode([id]) with special tokens kept (a
    byte-level tokenizer needs no space restoration); a byte of a character as U+FFFD;
    unknown ids as ""."""
    hello, emoji = tok.encode("Hello there"), tok.encode("😀")
    assert "".join(decode_logprob_token(tok, i) for i in hello) == "Hello there"
    assert decode_logprob_token(tok, emoji[0]) == "\ufffd"  # one byte of the emoji
    for i in hello + emoji:
        assert decode_logprob_token(tok, i) == tok.hf.decode([i])
    assert decode_logprob_token(tok, tok.eos_token_id) == tok.hf.eos_token == "<|eos|>"
    assert decode_logprob_token(tok, 10**6) == "" == decode_logprob_token(tok, -1)


def test_decode_logprob_token_restores_sentencepiece_spaces(sp_tok):
    """SentencePiece-style: decode strips a lone token's leading space; vLLM puts back one
    space per leading "\u2581" of the vocabulary piece that decode dropped."""
    ids = sp_tok.encode("the the  the", add_special_tokens=False)
    assert sp_tok.convert_ids_to_tokens(ids) == ["\u2581the", "\u2581the", "\u2581", "\u2581the"]
    assert [sp_tok.decode([i]) for i in ids] == ["the", "the", "", "the"]
    assert [decode_logprob_token(sp_tok, i) for i in ids] == [" the", " the", " ", " the"]
    three = sp_tok.convert_tokens_to_ids("\u2581\u2581\u2581")
    assert sp_tok.decode([three]) == "  "  # one of three spaces stripped: one put back
    assert decode_logprob_token(sp_tok, three) == "   "
    he = sp_tok.convert_tokens_to_ids("he")
    assert decode_logprob_token(sp_tok, he) == "he"  # no marker, nothing to restore
    assert decode_logprob_token(sp_tok, sp_tok.eos_token_id) == "</s>"
    byte = sp_tok.convert_tokens_to_ids("<0xE6>")
    assert decode_logprob_token(sp_tok, byte) == "\ufffd"


def test_decode_logprob_tokens_completes_characters(tok):
    """Tokens at one position (own token, then alternatives) with the request's preceding own
    tokens as context: a byte token that does not finish its character reads "" (vLLM), the
    one that does reads as the whole character; other tokens as they decode alone."""
    a, *emoji = tok.encode("a😀")
    assert len(emoji) == 4
    seq = [a, *emoji]
    got = [decode_logprob_tokens(tok, [t], seq[:k])[0] for k, t in enumerate(seq)]
    assert got == ["a", "", "", "", "😀"]
    # alternatives at the last position are corrected against the same context
    alt = tok.encode("😃")[-1]  # same first three bytes, another last byte
    x = tok.encode("x")[0]
    assert decode_logprob_tokens(tok, [emoji[3], alt, x, emoji[0]], seq[:4]) == [
        "😀", "😃", "x", ""]
    # no context: a byte alone is an unfinished character
    assert decode_logprob_tokens(tok, [emoji[3]], []) == [""]
    # only the last 4 context tokens count: enough for any UTF-8 character
    assert decode_logprob_tokens(tok, [emoji[3]], [a, a, a, a, *emoji[:3]]) == ["😀"]
    assert decode_logprob_tokens(tok, [emoji[3]], [*emoji[:3], a]) == [""]


def test_decode_logprob_tokens_attributes_the_whole_character(tok):
    """The completing token's text is what the context's clean prefix (its tokens before the
    trailing run of lone-U+FFFD tokens) does not already show: the whole character, even when
    the context starts inside another one."""
    ids = tok.encode("x漢")
    assert len(ids) == 4
    assert decode_logprob_tokens(tok, [ids[3]], ids[:3]) == ["漢"]
    lone = tok.encode("😀")[1]  # a continuation byte: never completes anything
    assert decode_logprob_tokens(tok, [ids[3]], [lone, *ids[1:3]]) == ["漢"]
    assert decode_logprob_tokens(tok, [lone], ids) == [""]


def test_decode_logprob_tokens_sentencepiece(sp_tok):
    """Byte-fallback tokens: <0xE6><0xBC><0xA2> is "漢"; the completing byte reads as it, with
    the space of a preceding "\u2581" token left to that token."""
    ids = sp_tok.encode("the 漢", add_special_tokens=False)
    assert sp_tok.convert_ids_to_tokens(ids) == [
        "\u2581the", "\u2581", "<0xE6>", "<0xBC>", "<0xA2>"]
    got = [decode_logprob_tokens(sp_tok, [t], ids[:k])[0] for k, t in enumerate(ids)]
    assert got == [" the", " ", "", "", "漢"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_split_of_emoji_and_cjk_streams_the_full_decode(tok, backend):
    """Exhaustively: every way of cutting a short emoji + CJK output into steps (2**(n-1)
    splits) streams exactly its full decode."""
    ids = tok.encode("x😀 漢é")
    assert 6 <= len(ids) <= 12, len(ids)  # several tokens per character: the splits matter
    full = tok.decode(ids)
    for mask in range(2 ** (len(ids) - 1)):
        bounds = [0, *[i + 1 for i in range(len(ids) - 1) if mask >> i & 1], len(ids)]
        chunks = [ids[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
        deltas, _ = stream(make(tok, [5, 6], backend), chunks)
        assert "".join(deltas) == full, chunks
