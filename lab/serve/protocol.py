"""Request bodies of the OpenAI-compatible server, shaped like OpenAI's (and vLLM's extras).

Unknown fields are refused (`extra="forbid"`): the server answers 400 naming them. Token ids
are strict integers: JSON's true / false / 1.5 are refused, never read as 1 / 0 / 1.
"""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

_XArg = StrictStr | StrictInt | StrictFloat  # vLLM's vllm_xargs values: strings and numbers


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    """Fields both endpoints share (OpenAI's, plus vLLM's sampling extras)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    user: str | None = None
    # vLLM's extension field: per-request values for custom logits processors / plug-ins,
    # handed on as SamplingParams.extra_args
    vllm_xargs: dict[str, _XArg | list[_XArg]] | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[StrictInt] | list[str]
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None


class TextPart(_Strict):
    """One part of an OpenAI content array; lab's models read text only."""

    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    """One message: its content a text, or OpenAI's array of text parts; an assistant message
    may have none (null), as in OpenAI's and vLLM's API."""

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content: object) -> object:
        """Refuse a part of another type (image_url, input_audio, file, ...) saying so,
        rather than with every way pydantic finds it is neither a text nor a text part."""
        if isinstance(content, list):
            for i, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text":
                    what = (f"has type {part.get('type')!r}" if isinstance(part, dict)
                            else "is no object")
                    raise ValueError(f"only text content parts ({{'type': 'text', 'text': "
                                     f"...}}) are supported; part {i} {what}")
        return content

    @model_validator(mode="after")
    def _content_unless_assistant(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content (only an assistant message "
                             "may have none)")
        return self

    @property
    def text(self) -> str:
        """The content as one text: text parts joined by newlines (vLLM's rule); none: ''."""
        if isinstance(self.content, list):
            return "\n".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
