"""Preemption strategies (the `preemption` config group): what happens to a preempted request."""

from __future__ import annotations

from abc import ABC, abstractmethod

from lab.cache.manager import KVCacheManager
from lab.engine.request import Request, RequestStatus
from lab.scheduler.queues import RequestQueue


class PreemptionStrategy(ABC):
    """Base class of the `preemption` group."""

    name = "base"

    @abstractmethod
    def preempt(self, request: Request, kv: KVCacheManager, waiting: RequestQueue) -> None:
        """Take a running request out of the batch and release (or park) its KV blocks."""


class RecomputePreemption(PreemptionStrategy):
    """Free the blocks (their hashes stay, so re-admission hits the prefix cache) and requeue
    the request at the front; its tokens are recomputed when it is admitted again."""

    name = "recompute"

    def preempt(self, request: Request, kv: KVCacheManager, waiting: RequestQueue) -> None:
        kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        waiting.prepend(request)
