"""CachedRequestState: what the model runner keeps of a request between steps (the scheduler
sends only deltas)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lab.core.sampling_params import SamplingParams


@dataclass
class CachedRequestState:
    req_id: str
    params: SamplingParams
    generator: torch.Generator | None
    prompt_token_ids: list[int]
    num_computed: int  # the scheduler's count when it last scheduled the request
    output_token_ids: list[int] = field(default_factory=list)  # live: processors read it
    row: int | None = None  # its row of the token / block tables while it has one
    prompt_logprobs_done: int = 0  # prompt positions whose next-token logprobs were sent
    # speculative decoding may draft for it: no configured logits processor acts on it
    # (LogitsProcessor.speculates)
    speculates: bool = True

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids
