"""Preemption strategies (the `preemption` config group): what happens to a preempted request
(`preempt`) and how it gets its KV blocks back when it is admitted again (`resume`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from lab.cache.coordinator import GroupBlocks
from lab.cache.manager import KVCacheManager
from lab.core.request import Request, RequestStatus
from lab.scheduler.queues import RequestQueue


@dataclass
class Admission:
    """Blocks given to a waiting request for its first chunk of `num_new_tokens` tokens, after
    `num_hit_tokens` found in the prefix cache (added to its computed tokens on admission)."""

    blocks: GroupBlocks  # the new blocks of each KV cache group
    num_hit_tokens: int
    num_new_tokens: int


#: the first chunk a request may compute given the tokens it is owed (budget, threshold)
ChunkRule = Callable[[int], int]


def admit_from_prefix(request: Request, kv: KVCacheManager, chunk: ChunkRule) -> Admission | None:
    """A request with nothing computed (new, or preempted for recompute): look up the prefix
    cache, then allocate blocks for its first chunk. None when the blocks do not fit."""
    hits, num_hit = kv.get_computed_blocks(request)
    n = chunk(request.num_tokens - num_hit)
    blocks = kv.allocate_slots(request, n, num_hit, hits)
    return None if blocks is None else Admission(blocks, num_hit, n)


class PreemptionStrategy(ABC):
    """Base class of the `preemption` group: what happens to a victim. Which request is the
    victim is the queue policy's choice (`RequestQueue.victim` / `preempt_for`, which read the
    KV cache through a KVCacheView), never the strategy's."""

    name = "base"
    #: False for admission-control strategies that promise never to preempt
    preempts = True

    #: True when the strategy parks KV blocks in the CPU swap space (the worker allocates it)
    uses_swap_space = False

    @abstractmethod
    def preempt(self, request: Request, kv: KVCacheManager, waiting: RequestQueue) -> str:
        """Take a running request out of the batch, release (or park) its KV blocks and requeue
        it. Returns the name of what was done (a strategy may fall back to another)."""

    def resume(self, request: Request, kv: KVCacheManager, chunk: ChunkRule) -> Admission | None:
        """Blocks for a request this strategy preempted, now admitted again (None: they do not
        fit, nothing changed). Default: recompute it, from whatever the prefix cache holds."""
        return admit_from_prefix(request, kv, chunk)

    def unresume(self, request: Request, kv: KVCacheManager) -> None:
        """Take back this step's `resume` (the request was un-admitted within the step)."""
        kv.free(request)

    def can_admit(self, request: Request, kv: KVCacheManager, running: list[Request]) -> bool:
        """Admission control: may `request` start now? (Default: whenever blocks allow.)"""
        return True


class RecomputePreemption(PreemptionStrategy):
    """Free the blocks (their hashes stay, so re-admission hits the prefix cache) and requeue
    the request at the front; its tokens are recomputed when it is admitted again."""

    name = "recompute"

    def preempt(self, request: Request, kv: KVCacheManager, waiting: RequestQueue) -> str:
        requeue_for_recompute(request, kv, waiting)
        return self.name


def requeue_for_recompute(request: Request, kv: KVCacheManager, waiting: RequestQueue) -> None:
    """Free the request's blocks (hashes kept) and put it back at the front of the queue."""
    kv.free(request)
    request.status = RequestStatus.PREEMPTED
    request.num_computed_tokens = 0
    request.num_preemptions += 1
    waiting.prepend(request)


class SwapPreemption(PreemptionStrategy):
    """Park the victim's computed KV blocks in the CPU swap space (`cache.swap_space_gb`) and
    requeue it at the front, so it resumes before new admissions (in the policy's order) by
    copying its blocks back instead of recomputing them. When the swap space cannot hold them
    the victim is recomputed instead (counted as a swap fallback)."""

    name = "swap"
    uses_swap_space = True

    def preempt(self, request: Request, kv: KVCacheManager, waiting: RequestQueue) -> str:
        if not kv.swap_out(request):
            requeue_for_recompute(request, kv, waiting)
            return RecomputePreemption.name
        request.status = RequestStatus.SWAPPED
        request.num_preemptions += 1
        waiting.prepend(request)
        return self.name

    def resume(self, request: Request, kv: KVCacheManager, chunk: ChunkRule) -> Admission | None:
        """A swapped request takes back its blocks still cached on the device and copies the
        rest from the swap space (KVCacheManager.resume_swapped); one that fell back to
        recompute is recomputed."""
        if request.status != RequestStatus.SWAPPED:
            return super().resume(request, kv, chunk)
        n = chunk(request.num_tokens - request.num_computed_tokens)
        blocks = kv.resume_swapped(request, n)
        return None if blocks is None else Admission(blocks, 0, n)

    def unresume(self, request: Request, kv: KVCacheManager) -> None:
        if request.status == RequestStatus.SWAPPED:
            kv.undo_resume(request)  # swapped out again
        else:
            kv.free(request)


class ReservePreemption(RecomputePreemption):
    """Admission control instead of preemption (the mini-sglang policy): a request is admitted
    only when the free blocks cover its whole future (prompt + max_tokens, capped by
    max_model_len) on top of what every running request may still need, so a running request
    never lacks a block and preemption never happens. Prefix hits, and the blocks a sliding
    window frees, are not credited (conservative).
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
        return kv.num_groups * max(0, need - kv.num_block_positions(request.request_id))
