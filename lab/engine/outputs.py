"""What the offline API returns (vLLM's RequestOutput / CompletionOutput / Logprob shape)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lab.metrics.stats import RequestStats


@dataclass
class Logprob:
    """One token's log probability at one position, its rank, and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# per generated token: {token id: Logprob}, the sampled token first, then the top-k
SampleLogprobs = list[dict[int, Logprob]]
# per prompt token: None for the first (nothing predicts it), then as above
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None  # the sum of the sampled tokens' logprobs
    logprobs: SampleLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    metrics: RequestStats | None = None
    prompt_logprobs: PromptLogprobs | None = None
    num_cached_tokens: int | None = None
