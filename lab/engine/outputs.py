"""What the offline API returns (vLLM's RequestOutput / CompletionOutput shape)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lab.metrics.stats import RequestStats


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    metrics: RequestStats | None = None
