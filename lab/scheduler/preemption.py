"""Preemption strategies (the `preemption` config group): what happens to a preempted request."""

from __future__ import annotations

from abc import ABC, abstractmethod

from lab.cache.manager import KVCacheManager
from lab.engine.request import Request, RequestStatus
from lab.scheduler.queues import RequestQueue


class PreemptionStrategy(ABC):
    """Base class of the `preemption` group."""

    name = "base"
    #: False for admission-control strategies that promise never to preempt
    preempts = True

    @abstractmethod
    def preempt(self, request: Request, kv: KVCacheManager, waiting: RequestQueue) -> None:
        """Take a running request out of the batch and release (or park) its KV blocks."""

    def can_admit(self, request: Request, kv: KVCacheManager, running: list[Request]) -> bool:
        """Admission control: may `request` start now? (Default: whenever blocks allow.)"""
        return True


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


class ReservePreemption(RecomputePreemption):
    """Admission control instead of preemption (the mini-sglang policy): a request is admitted
    only when the free blocks cover its whole future (prompt + max_tokens, capped by
    max_model_len) on top of what every running request may still need, so a running request
    never lacks a block and preemption never happens. Prefix hits are not credited (conservative).
    The baseline the preempting strategies are compared with."""

    name = "reserve"
    preempts = False  # not even to admit a more important request (scheduler=priority)

    def can_admit(self, request: Request, kv: KVCacheManager, running: list[Request]) -> bool:
        outstanding = sum(self._future_blocks(r, kv) for r in running)
        return kv.num_free_blocks - outstanding >= self._future_blocks(request, kv)

    @staticmethod
    def _future_blocks(request: Request, kv: KVCacheManager) -> int:
        total = request.num_prompt_tokens + request.sampling_params.max_tokens
        need = -(-min(total, kv.max_model_len) // kv.block_size)
        return max(0, need - len(kv.get_block_ids(request.request_id)))
