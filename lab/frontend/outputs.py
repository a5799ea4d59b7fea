"""What the offline API returns (vLLM's RequestOutput / CompletionOutput / Logprob shape)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from lab.core.stats import RequestStats


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

    def add_delta(self, delta: RequestOutput) -> RequestOutput:
        """Append a later DELTA output of the same request (per completion index: text, token
        ids, logprobs; the latest finish / stop reason, cumulative logprob, metrics); returns
        self. Used to accumulate a stream, and to merge deltas a slow consumer has not taken
        yet into one (vLLM's RequestOutputCollector)."""
        by_index = {c.index: c for c in self.outputs}
        for c in delta.outputs:
            a = by_index.get(c.index)
            if a is None:
                by_index[c.index] = replace(
                    c, token_ids=list(c.token_ids),
                    logprobs=None if c.logprobs is None else list(c.logprobs))
                continue
            a.text += c.text
            a.token_ids = list(a.token_ids) + list(c.token_ids)
            if c.logprobs is not None:
                a.logprobs = (a.logprobs or []) + list(c.logprobs)
            a.finish_reason, a.stop_reason = c.finish_reason, c.stop_reason
            if c.cumulative_logprob is not None:
                a.cumulative_logprob = c.cumulative_logprob
        self.outputs = [by_index[i] for i in sorted(by_index)]
        if delta.prompt_logprobs:
            self.prompt_logprobs = (self.prompt_logprobs or []) + list(delta.prompt_logprobs)
        self.finished = delta.finished
        self.metrics = delta.metrics if delta.metrics is not None else self.metrics
        if delta.num_cached_tokens is not None:
            self.num_cached_tokens = delta.num_cached_tokens
        return self
