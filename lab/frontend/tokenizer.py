"""A small tokenizer wrapper over transformers.AutoTokenizer.

Thread-safety: a server tokenizes on a thread of its own while the engine detokenizes on
another (lab/engine/async_llm.py), both through the one HF tokenizer. That is safe as long as
each call only reads the Rust tokenizer (encode, decode, DecodeStream.step take shared borrows;
encode releases the GIL); transformers mutates it only to change its truncation / padding /
special-token-splitting state, which a call asking for another state than the current one
does ("Already borrowed" if a read runs meanwhile). lab never asks for truncation or padding,
and `load_tokenizer` settles that state with one encode before anyone else uses the tokenizer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from functools import cached_property
from pathlib import Path

from lab.frontend.chars_per_token import max_chars_per_token


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

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; add_special_tokens=False for text that carries its own (a
        rendered chat template)."""
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of `text` alone, without special tokens (e.g. for bad words)."""
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @cached_property
    def max_chars_per_token(self) -> Fraction | None:
        """The most characters of text one token stands for (None: no bound is known), read
        once from the tokenizer's pipeline (lab/frontend/chars_per_token.py)."""
        return max_chars_per_token(self.hf)

    def min_num_tokens(self, text: str) -> int:
        """A lower bound on len(encode(text)) that costs no tokenizing (0 when no bound is
        known): a prompt whose bound reaches the context limit cannot fit."""
        most = self.max_chars_per_token
        return 0 if most is None else math.ceil(len(text) / most)

    def render_chat(
        self, conversation: list[dict], chat_template: str | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """A conversation rendered with the tokenizer's chat template (or `chat_template`), as
        text; a tokenizer without one is refused with a clear message, and so is a conversation
        the template refuses (a ValueError: the caller's input, as vLLM's server answers 400)."""
        if chat_template is None and not getattr(self.hf, "chat_template", None):
            raise ValueError("this tokenizer has no chat template: pass chat_template=... "
                             "(a Jinja template, as in transformers)")
        from jinja2 import TemplateError

        try:
            return self.hf.apply_chat_template(
                conversation, chat_template=chat_template,
                add_generation_prompt=add_generation_prompt, tokenize=False)
        except TemplateError as e:  # e.g. the template's raise_exception("roles must ...")
            raise ValueError(f"the chat template refused the conversation: {e}") from e

    def apply_chat_template(
        self, conversation: list[dict], chat_template: str | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """The token ids of a rendered conversation: the template writes its special tokens
        itself, so none are added (as transformers' tokenize=True does)."""
        text = self.render_chat(conversation, chat_template, add_generation_prompt)
        return self.encode(text, add_special_tokens=False)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load the tokenizer stored in a checkpoint directory."""
    from transformers import AutoTokenizer

    tokenizer = Tokenizer(AutoTokenizer.from_pretrained(str(path)))
    tokenizer.encode("")  # settles the backend's truncation / padding state (module docstring)
    return tokenizer
