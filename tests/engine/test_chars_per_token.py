"""The bound on characters per token (lab/frontend/chars_per_token.py) that lets a server refuse
an over-long text prompt before tokenizing it: it never refuses a text that fits. Random texts
of the boundary size (the longest the early check lets through), built from what makes tokens
cover the most text (the longest vocabulary entries, special tokens, sequences NFC composes),
have at least as many tokens as the bound says; pipelines that may drop or fuse characters have
no bound (and the texts that break a naive one show why)."""

import random
import unicodedata
from types import SimpleNamespace

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers

from lab.frontend.chars_per_token import MAX_COMPOSED, max_chars_per_token
from lab.frontend.tokenizer import load_tokenizer
from lab.models.tiny import ensure_tiny_model

MAX_MODEL_LEN = 128


@pytest.fixture(scope="module")
def tiny():
    return load_tokenizer(ensure_tiny_model("tiny_llama"))


def test_max_composed_is_unicodes_longest_canonical_decomposition():
    longest = max(len(unicodedata.normalize("NFD", chr(c))) for c in range(0x110000)
                  if not 0xD800 <= c <= 0xDFFF)
    assert longest == MAX_COMPOSED


def test_tiny_llama_bound(tiny):
    """Byte-level BPE under NFC: the longest entry (`<|endoftext|>`, 13) times NFC's 4."""
    longest = max(map(len, tiny.hf.get_vocab()))
    assert longest == 13 and tiny.max_chars_per_token == 13 * MAX_COMPOSED
    assert tiny.min_num_tokens("") == 0 and tiny.min_num_tokens("x" * 53) == 2


def _pieces(tokenizer) -> list[str]:
    """Texts that make few tokens per character: the longest vocabulary entries (as text),
    special tokens, sequences NFC composes into one character (a Hangul syllable from three
    jamo, alpha with three marks: four code points), whitespace runs, and random Unicode."""
    vocab = tokenizer.hf.get_vocab()
    longest = sorted(vocab, key=len)[-40:]
    pieces = [tokenizer.decode([vocab[t]], skip_special_tokens=False) for t in longest]
    pieces += ["\u1100\u1161\u11a8", "\u03b1\u0313\u0342\u0345", "e\u0301", " " * 17, "\n\n"]
    rng = random.Random(0)
    pieces += ["".join(chr(rng.randrange(0x20, 0x2FFFF)) for _ in range(5)) for _ in range(20)]
    return [p for p in pieces if p.encode("utf-8", "ignore").decode() == p]


@pytest.mark.parametrize("seed", range(12))
def test_a_text_of_the_boundary_size_has_at_least_the_bound_in_tokens(tiny, seed):
    """The longest text the early check lets through (a bound of max_model_len - 1 tokens):
    the bound never exceeds its real token count, so the check never refuses a prompt that
    fits."""
    rng = random.Random(seed)
    size = int(tiny.max_chars_per_token * (MAX_MODEL_LEN - 1))
    pieces = _pieces(tiny)
    text = ""
    while len(text) < size:
        text += rng.choice(pieces)
    text = text[:size]
    assert tiny.min_num_tokens(text) <= len(tiny.encode(text))
    assert tiny.min_num_tokens(text) < MAX_MODEL_LEN  # let through


def test_special_tokens_only_is_the_tightest_text(tiny):
    """13 characters a token: the bound (52) holds with NFC's factor to spare."""
    text = "<|endoftext|>" * 500
    assert len(tiny.encode(text)) >= 500 >= tiny.min_num_tokens(text)


def _wrap(backend: Tokenizer) -> SimpleNamespace:
    return SimpleNamespace(backend_tokenizer=backend)


def _sentencepiece_like() -> Tokenizer:
    """Llama-2's shape: `▁` for spaces (Prepend + Replace), BPE with byte fallback."""
    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    for piece in ["▁", "t", "h", "e", "▁t", "▁th", "▁the"]:
        vocab[piece] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("▁", "t"), ("▁t", "h"), ("▁th", "e")],
                               byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    return tok


def test_a_byte_fallback_pipeline_has_a_bound_that_holds():
    tok = _sentencepiece_like()
    assert max_chars_per_token(_wrap(tok)) == 6  # `<0x00>`: no normalizer shrinks the text
    rng = random.Random(0)
    for _ in range(20):
        text = "".join(rng.choice([" the", "the", " ", "é", "\U0001f600", "x"])
                       for _ in range(300))
        assert len(text) / 6 <= len(tok.encode(text).ids)


def _byte_level(**pipeline) -> Tokenizer:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    for name, value in pipeline.items():
        setattr(tok, name, value)
    return tok


def _word_level() -> Tokenizer:
    tok = Tokenizer(models.WordLevel(vocab={"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def _lstrip_token() -> Tokenizer:
    tok = _byte_level()
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True)])
    return tok


def _fused_unknowns() -> Tokenizer:
    return Tokenizer(models.BPE(vocab={"a": 0, "<unk>": 1}, merges=[], unk_token="<unk>",
                                fuse_unk=True))


@pytest.mark.parametrize("build,text", [
    (_word_level, "a" + " " * 1000),  # Whitespace drops the spaces
    (_word_level, "b" * 1000),  # one [UNK] for a word of any length
    (lambda: _byte_level(normalizer=normalizers.Strip()), " " * 1000 + "a"),
    (lambda: _byte_level(normalizer=normalizers.Replace(Regex(" +"), " ")), " " * 1000),
    (_lstrip_token, " " * 1000 + "<mask>"),  # the token swallows the whitespace before it
    (_fused_unknowns, "b" * 1000),  # a run of unknown characters is one <unk>
], ids=["whitespace", "unk-word", "strip", "regex-replace", "lstrip-token", "fused-unk"])
def test_a_pipeline_that_may_drop_or_fuse_characters_has_no_bound(build, text):
    tok = build()
    assert max_chars_per_token(_wrap(tok)) is None
    longest = max(map(len, tok.get_vocab(with_added_tokens=True)))
    assert len(tok.encode(text).ids) < len(text) / (MAX_COMPOSED * longest)  # a naive bound fails


def test_a_slow_tokenizer_has_no_bound():
    assert max_chars_per_token(object()) is None
