"""A small tokenizer wrapper over transformers.AutoTokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


class Tokenizer:
    """encode/decode text; special tokens are added only where the tokenizer's config says so
    (e.g. a Llama tokenizer's BOS), never by this wrapper."""

    def __init__(self, hf_tokenizer) -> None:
        self.hf = hf_tokenizer

    @property
    def eos_token_id(self) -> int | None:
        return self.hf.eos_token_id

    @property
    def bos_token_id(self) -> int | None:
        return self.hf.bos_token_id

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer knows, added tokens included."""
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load the tokenizer stored in a checkpoint directory."""
    from transformers import AutoTokenizer

    return Tokenizer(AutoTokenizer.from_pretrained(str(path)))
