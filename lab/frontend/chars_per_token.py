"""The most characters of text one token can stand for, read from a tokenizer's pipeline: a
lower bound on a text's token count that costs no tokenizing (`len(text) / bound`). A server
refuses a prompt of 10**6 words with it at once, instead of tokenizing megabytes to learn that
they do not fit the model's context.

Why the bound holds. A Hugging Face fast tokenizer turns text into tokens in four stages:

1. added tokens (`<|endoftext|>`, ...) are matched in the text; each match is one token standing
   for its own content, whose length is at most L, the longest vocabulary entry;
2. the normalizer rewrites the rest. Each normalizer this module accepts shrinks the text by at
   most a known factor: NFD, NFKD, Lowercase, Prepend, ByteLevel never shorten it (every
   character becomes one or more); NFC and NFKC compose, and a composed character stands for at
   most MAX_COMPOSED code points (its canonical decomposition: 4 in every Unicode version, since
   composition exclusions freeze the composites NFC may produce); Replace of a literal string p
   by a non-empty c shrinks by at most len(p) / len(c). A Sequence multiplies its factors;
3. the pre-tokenizer splits the text into pieces. The accepted ones keep every character
   (ByteLevel even turns each into its UTF-8 bytes, one character per byte; Metaspace turns a
   space into one `▁`); those that drop characters (Whitespace, BertPreTokenizer, a Split that
   removes its matches) are refused;
4. the model covers each piece with vocabulary entries. A BPE or Unigram token covers at most
   its own string (BPE merges concatenate, a subword prefix only lengthens the string), so at
   most L characters of the piece, provided no character is unknown: an unknown one may be
   dropped, or a run of them fused into one unknown token of any length. So the model must
   fall back to bytes (`<0x00>` ... `<0xFF>` all in the vocabulary), or a byte-level BPE must
   have all 256 byte characters in its vocabulary.

So a text of n characters has at least n / (s * L) tokens, s the normalizer's factor (the
post-processor only adds BOS-like tokens). Anything this module cannot vouch for (WordPiece's
[UNK] for a long word, a Strip normalizer, a regex Replace, an added token that swallows the
whitespace around it, a slow tokenizer) gives None: no bound, the text is tokenized to count.
"""

from __future__ import annotations

import json
from fractions import Fraction

#: the most code points NFC / NFKC compose into one character (max len of an NFD)
MAX_COMPOSED = 4
#: normalizers that never shorten a text
_GROWING = {"NFD", "NFKD", "Lowercase", "Prepend", "ByteLevel"}
#: pre-tokenizers that keep every character of the text
_KEEPING = {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts", "FixedLength"}
_BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]


def max_chars_per_token(hf_tokenizer) -> Fraction | None:
    """The most characters of text one token of `hf_tokenizer` stands for (see the module
    docstring), or None where its pipeline allows no such bound."""
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    vocab = backend.get_vocab(with_added_tokens=True)
    shrink = _normalizer_shrink(spec.get("normalizer"))
    if (shrink is None or not _keeps_characters(spec.get("pre_tokenizer"))
            or not _covers_every_character(spec, vocab)
            or any(t.get("lstrip") or t.get("rstrip") for t in spec.get("added_tokens") or ())):
        return None
    return shrink * max(map(len, vocab))


def _normalizer_shrink(node: dict | None) -> Fraction | None:
    """By how much a normalizer may shorten a text at most (None: without bound)."""
    if node is None or node["type"] in _GROWING:
        return Fraction(1)
    kind = node["type"]
    if kind in ("NFC", "NFKC"):
        return Fraction(MAX_COMPOSED)
    if kind == "Replace":
        pattern, content = node["pattern"].get("String"), node["content"]
        if pattern is None or not content:  # a regex, or a deletion
            return None
        return max(Fraction(1), Fraction(len(pattern), len(content)))
    if kind == "Sequence":
        total = Fraction(1)
        for child in node["normalizers"]:
            factor = _normalizer_shrink(child)
            if factor is None:
                return None
            total *= factor
        return total
    return None  # Strip, StripAccents, BertNormalizer, Precompiled, Nmt, ...: may delete


def _keeps_characters(node: dict | None) -> bool:
    """Whether a pre-tokenizer hands every character of the text on to the model."""
    if node is None or node["type"] in _KEEPING:
        return True
    if node["type"] in ("Split", "Punctuation"):
        return node.get("behavior") != "Removed"
    if node["type"] == "Sequence":
        return all(_keeps_characters(child) for child in node["pretokenizers"])
    return False  # Whitespace, WhitespaceSplit, BertPreTokenizer, CharDelimiterSplit, ...


def _covers_every_character(spec: dict, vocab: dict[str, int]) -> bool:
    """Whether the model turns every character into tokens of its own: byte fallback with
    all 256 byte tokens, or a byte-level BPE whose vocabulary has all 256 byte characters."""
    model = spec["model"]
    if model["type"] not in ("BPE", "Unigram"):
        return False  # WordPiece, WordLevel: one [UNK] for a word of any length
    if model.get("byte_fallback"):
        return all(t in vocab for t in _BYTE_TOKENS)
    if model["type"] == "BPE" and _is_byte_level(spec):
        from tokenizers.pre_tokenizers import ByteLevel

        return all(c in vocab for c in ByteLevel.alphabet())
    return False


def _is_byte_level(spec: dict) -> bool:
    """Whether the normalizer or the pre-tokenizer turns the text into byte characters."""
    def has(node: dict | None, children: str) -> bool:
        if node is None:
            return False
        return node["type"] == "ByteLevel" or any(has(c, children)
                                                   for c in node.get(children) or ())
    return has(spec.get("pre_tokenizer"), "pretokenizers") or \
        has(spec.get("normalizer"), "normalizers")
