"""Request: the scheduler's view of one generation (token ids, progress, status, timestamps).

Range diagram of a request's tokens (the invariant the scheduler keeps):

    | prompt ............................ | outputs ........ | drafts |
    | computed (KV in cache) | owed to this step / later               |
    0                 num_computed_tokens              num_tokens        num_tokens_with_spec

Drafts (`spec_token_ids`) are a proposer's guesses at the next tokens (lab/speculative): owed
like any token, verified by the step that computes them, never part of `all_token_ids` until
the rejection sampler accepts them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from lab.core.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2  # waiting again; its KV blocks were freed (recomputed when it resumes)
    SWAPPED = 3  # waiting again; its computed KV blocks are parked in the CPU swap space
    # Everything above SWAPPED is finished.
    FINISHED_STOPPED = 4
    FINISHED_LENGTH_CAPPED = 5
    FINISHED_ABORTED = 6
    FINISHED_IGNORED = 7
    FINISHED_ERROR = 8  # its step failed (the executor raised, or the step was interrupted)

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.SWAPPED


FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_IGNORED: "ignored",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass
class RequestTimes:
    """Engine-clock timestamps (seconds, time.perf_counter) of a request's events."""

    arrival: float
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None
    preempted_at: float | None = None
    time_preempted: float = 0.0
    swapped_at: float | None = None
    time_swapped: float = 0.0
    token_times: list[float] = field(default_factory=list)


class Request:
    """One request as the scheduler tracks it. Holds no tensors."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_id: int | None,
        arrival_time: float,
        priority: int = 0,
        client_id: str | None = None,
        block_hasher: Callable[[Request], list[bytes]] | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.priority = priority
        self.client_id = client_id
        self.arrival_time = arrival_time
        self.times = RequestTimes(arrival=arrival_time)
        self.output_token_ids: list[int] = []
        self.spec_token_ids: list[int] = []  # drafts the next step verifies (lab/speculative)
        self.num_draft_tokens = 0  # drafts verified over the request's life
        self.num_accepted_tokens = 0  # of which accepted
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1  # prefix-cache hit tokens at first admission
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.stop_reason: int | None = None
        self._block_hasher = block_hasher
        self.block_hashes: list[bytes] = []
        self.update_block_hashes()

    # -- sizes ---------------------------------------------------------------------------------
    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self.all_token_ids) + len(self.spec_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)

    # -- mutation ------------------------------------------------------------------------------
    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        self.update_block_hashes()

    def update_block_hashes(self) -> None:
        """Hash every block that became full since the last call (chained hashes)."""
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    def sort_key(self) -> tuple[float, float, str]:
        """(priority, arrival, id): a total order that never compares Request objects."""
        return (self.priority, self.arrival_time, self.request_id)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, "
            f"computed={self.num_computed_tokens}/{self.num_tokens})"
        )
