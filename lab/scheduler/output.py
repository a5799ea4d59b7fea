"""What crosses from the scheduler to the worker (ids, counts, block ids; never tensors)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lab.sampling.params import SamplingParams


@dataclass
class NewRequestData:
    """A request the worker has not seen: everything it needs to cache its state."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    """A delta for a request the worker already holds.

    resumed_from_preemption: the block ids replace the old ones instead of being appended.
    """

    req_id: str
    new_block_ids: list[int]
    num_computed_tokens: int
    resumed_from_preemption: bool = False


@dataclass
class SchedulerOutput:
    """One step's schedule. num_computed_tokens above are the values *before* this step."""

    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: list[CachedRequestData] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    finished_req_ids: set[str] = field(default_factory=set)
    preempted_req_ids: set[str] = field(default_factory=set)
    # KV block copies the worker applies before the forward pass: every swap-out, then every
    # swap-in. swap_out: (device block, cpu block); swap_in: (cpu block, device block).
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


@dataclass
class ModelRunnerOutput:
    """What the worker returns: one sampled token per request whose prompt is complete."""

    sampled_token_ids: dict[str, int] = field(default_factory=dict)
