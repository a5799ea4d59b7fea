"""The Workload seam: what requests a run sends, and when.

A workload is built by Hydra from `lab/conf/workload/` (`_target_`) and asked once for its requests,
given the model's vocabulary size and EOS id, so token ids can avoid special tokens.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from lab.core.sampling_params import SamplingParams


@dataclass
class WorkloadRequest:
    """One request of a workload: prompt ids, sampling, arrival (seconds from start), metadata."""

    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = 0.0
    priority: int = 0
    client_id: str | None = None
    request_id: str | None = None


class Workload(ABC):
    """Base of the `workload` config group: a generator of timed requests."""

    @abstractmethod
    def requests(
        self, vocab_size: int, eos_token_id: int | None, interpreted: bool = False
    ) -> list[WorkloadRequest]:
        """All requests of the run, sorted by `arrival_time` (ties keep generation order).

        `interpreted`: Triton kernels run in Triton's interpreter (no CUDA), orders of magnitude
        slower per step; a workload whose size was left to it may replay fewer requests then."""
