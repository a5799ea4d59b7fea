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

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of `text` alone, without special tokens (e.g. for bad words)."""
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)


    def apply_chat_template(
        self, conversation: list[dict], chat_template: str | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """The token ids of a conversation rendered with the tokenizer's chat template (or
        `chat_template`); a tokenizer without one is refused with a clear message."""
        if chat_template is None and not getattr(self.hf, "chat_template", None):
            raise ValueError("this tokenizer has no chat template: pass chat_template=... "
                             "(a Jinja template, as in transformers)")
        out = self.hf.apply_chat_template(
            conversation, chat_template=chat_template, add_generation_prompt=add_generation_prompt,
            tokenize=True)
        return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load the tokenizer stored in a checkpoint directory."""
    from transformers import AutoTokenizer

    return Tokenizer(AutoTokenizer.from_pretrained(str(path)))
