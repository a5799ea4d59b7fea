"""Queue policies (the `scheduler` config group): who goes next, who is preempted.

A policy only orders requests; the budgets, chunking and allocation live in `Scheduler`.
Orders never compare Request objects: ties always fall back to `Request.sort_key()`.
"""

from __future__ import annotations

import heapq
import math
from abc import ABC, abstractmethod
from collections import Counter, deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from lab.core.request import Request

if TYPE_CHECKING:
    from lab.cache.view import KVCacheView


class RequestQueue(ABC):
    """Base class of the `scheduler` group: the waiting queue and the choice of victim.

    The victim is chosen here and nowhere else: `victim` when a running request lacks a KV
    block, `preempt_for` when a waiting request should displace a running one. Both get `kv`, a
    read-only `lab.cache.view.KVCacheView` of the cache as it is at that moment:
    `kv.blocks_of(r)` gives the blocks a candidate holds, how many of them are in the prefix
    cache (`num_cached_blocks`) or shared with another request (`num_shared_blocks`: preempting
    it frees none of those), `num_freed_blocks` and its computed tokens; `kv.num_free_blocks`
    and `kv.usage` describe the whole cache. The scheduler always passes it; it is None only
    when a test calls the policy by hand. What then happens to the victim (recompute, swap) is
    the preemption strategy's (`lab/scheduler/preemption.py`), not the policy's.

    `token_cap` is the policy's other say in a step: at most how many tokens a request gets in
    it (a per-request `long_prefill_token_threshold`).
    """

    name = "base"

    @abstractmethod
    def add(self, request: Request) -> None:
        """Add a newly arrived request."""

    @abstractmethod
    def pop(self) -> Request:
        """Remove and return the request that should be admitted next."""

    @abstractmethod
    def peek(self) -> Request:
        """The request that would be popped next, without removing it."""

    @abstractmethod
    def prepend(self, request: Request) -> None:
        """Put back a preempted request so it is served before new arrivals of its class."""

    @abstractmethod
    def remove(self, request: Request) -> None:
        """Remove a request (an abort)."""

    @abstractmethod
    def __iter__(self) -> Iterator[Request]:
        """Iterate in policy order."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def victim(self, running: list[Request], kv: KVCacheView | None = None) -> Request:
        """The running request to preempt when a running request lacks a KV block (`running`
        in batch order, never empty; returning the request that asked preempts it). `kv`: the
        cache's read-only view (see the class docstring)."""

    def preempt_for(self, request: Request, running: list[Request],
                    kv: KVCacheView | None = None) -> Request | None:
        """A running request to preempt so that waiting `request` (the head) can be admitted
        when it lacks KV blocks or a sequence slot; None to let it wait. `kv` as in `victim`.
        (Default: None.)"""
        return None

    def token_cap(self, request: Request) -> int | None:
        """At most how many tokens `request` may get in the step being scheduled (an int >= 1),
        or None for no cap. Asked for every running request the step serves and for the waiting
        request about to be admitted; the scheduler applies it with
        `long_prefill_token_threshold` (the smaller wins), the token budget and max_model_len.
        A prefill longer than the cap is chunked over several steps; a decode needs 1 token, so
        a cap never holds it back. Override it in the policy's class: the scheduler asks only a
        policy whose class overrides it. (Default: None.)"""
        return None

    def on_step(self, now: float) -> None:
        """Called once at the start of every schedule() with the scheduler's clock (seconds).
        (Default: nothing.)"""
        return None

    def on_scheduled(self, request: Request, num_prefill_tokens: int,
                     num_decode_tokens: int) -> None:
        """Called for every request scheduled in a step with the tokens it was given.
        (Default: nothing.)"""
        return None

    def __bool__(self) -> bool:
        return len(self) > 0


class FCFSQueue(RequestQueue):
    """First come, first served; the newest running request is preempted first."""

    name = "fcfs"

    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._q.append(request)

    def pop(self) -> Request:
        return self._q.popleft()

    def peek(self) -> Request:
        return self._q[0]

    def prepend(self, request: Request) -> None:
        self._q.appendleft(request)

    def remove(self, request: Request) -> None:
        self._q.remove(request)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._q)

    def __len__(self) -> int:
        return len(self._q)

    def victim(self, running: list[Request], kv: KVCacheView | None = None) -> Request:
        return running[-1]


class PriorityQueue(RequestQueue):
    """Lowest `priority` value first, then earliest arrival, then request id (`sort_key`).

    A heap of (sort_key, entry number) with lazy deletion: `remove` only forgets the live entry
    and stale heap entries are skipped (or compacted away) later. add/pop O(log n), peek
    amortised O(1), remove O(1). The key is read when the request is added. A waiting request
    that is more important than a running one preempts it (`preempt_for`).
    """

    name = "priority"

    def __init__(self) -> None:
        self._heap: list[tuple[tuple[Any, ...], int]] = []
        self._live: dict[str, tuple[int, Request]] = {}  # request_id -> (entry number, request)
        self._entries = 0

    def add(self, request: Request) -> None:
        self._entries += 1
        self._live[request.request_id] = (self._entries, request)
        heapq.heappush(self._heap, (request.sort_key(), self._entries))

    prepend = add  # the order is by key: a preempted request goes back to its place

    def peek(self) -> Request:
        while self._heap:
            key, entry = self._heap[0]
            live = self._live.get(key[-1])  # key[-1] is the request id
            if live is not None and live[0] == entry:
                return live[1]
            heapq.heappop(self._heap)  # stale: removed or re-added
        raise IndexError("peek from an empty PriorityQueue")

    def pop(self) -> Request:
        request = self.peek()
        heapq.heappop(self._heap)
        del self._live[request.request_id]
        return request

    def remove(self, request: Request) -> None:
        if self._live.pop(request.request_id, None) is None:
            raise ValueError(f"{request.request_id!r} is not waiting")
        if len(self._heap) > 2 * len(self._live) + 64:  # compact so stale entries stay bounded
            self._heap = [(r.sort_key(), n) for n, r in self._live.values()]
            heapq.heapify(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return iter(sorted((r for _, r in self._live.values()), key=Request.sort_key))

    def __len__(self) -> int:
        return len(self._live)

    def victim(self, running: list[Request], kv: KVCacheView | None = None) -> Request:
        """The least important running request (largest priority value, latest arrival)."""
        return max(running, key=Request.sort_key)

    def preempt_for(self, request: Request, running: list[Request],
                    kv: KVCacheView | None = None) -> Request | None:
        if not running:
            return None
        victim = self.victim(running, kv)
        return victim if victim.priority > request.priority else None


class _ScanQueue(RequestQueue):
    """A waiting set ordered by `_key`, found by a linear scan: add/remove O(1), pop/peek O(n),
    iteration O(n log n). Fine for the thousands of waiting requests a run holds; it lets the key
    depend on state that changes every step (time, service counters) without re-heaping."""

    def __init__(self) -> None:
        self._reqs: dict[str, Request] = {}

    @abstractmethod
    def _key(self, request: Request) -> tuple[Any, ...]:
        """The smallest key is popped first; it must end in `request.sort_key()`."""

    def add(self, request: Request) -> None:
        self._reqs[request.request_id] = request

    def prepend(self, request: Request) -> None:
        self._reqs[request.request_id] = request  # the key decides where it goes

    def peek(self) -> Request:
        if not self._reqs:
            raise IndexError(f"peek from an empty {type(self).__name__}")
        return min(self._reqs.values(), key=self._key)

    def pop(self) -> Request:
        request = self.peek()
        del self._reqs[request.request_id]
        return request

    def remove(self, request: Request) -> None:
        if self._reqs.pop(request.request_id, None) is None:
            raise ValueError(f"{request.request_id!r} is not waiting")

    def __iter__(self) -> Iterator[Request]:
        return iter(sorted(self._reqs.values(), key=self._key))

    def __len__(self) -> int:
        return len(self._reqs)


def remaining_work(request: Request) -> int:
    """Tokens still to compute: the rest of the prompt plus the outputs not yet generated."""
    prompt_left = max(0, request.num_prompt_tokens - request.num_computed_tokens)
    return prompt_left + max(0, request.sampling_params.max_tokens - request.num_output_tokens)


class SJFQueue(_ScanQueue):
    """Shortest remaining work first, with aging: a request that has waited `aging_bound_s`
    (since arrival, by the clock given to `on_step`) goes before every non-aged one, aged ones
    in arrival order, so no request waits past the bound because shorter ones keep coming.
    The victim is the running request with the most remaining work. O(n) pop/peek."""

    name = "sjf"

    def __init__(self, aging_bound_s: float = 10.0) -> None:
        super().__init__()
        if not _is_number(aging_bound_s) or not aging_bound_s > 0:
            raise ValueError(f"aging_bound_s={aging_bound_s!r} must be a number > 0 (seconds)")
        self.aging_bound_s = aging_bound_s
        self._now: float | None = None  # before the first step nothing has waited

    def on_step(self, now: float) -> None:
        self._now = now

    def is_aged(self, request: Request) -> bool:
        """Has `request` waited at least the aging bound (as of the last on_step)?"""
        return self._now is not None and self._now - request.arrival_time >= self.aging_bound_s

    def _key(self, request: Request) -> tuple[Any, ...]:
        if self.is_aged(request):
            return (0, request.arrival_time, request.sort_key())
        return (1, remaining_work(request), request.sort_key())

    def victim(self, running: list[Request], kv: KVCacheView | None = None) -> Request:
        return max(running, key=lambda r: (remaining_work(r), r.sort_key()))


class FairQueue(_ScanQueue):
    """Per-client fairness after the Virtual Token Counter (Sheng et al., OSDI'24).

    Each client (`request.client_id`; None is one anonymous client) has a counter of the
    weighted service it received, `prefill_weight * prefill + decode_weight * decode` tokens,
    charged in `on_scheduled`. The waiting request of the least-served client goes next. When a
    request arrives for a client with nothing waiting, its counter is lifted to at least the
    smallest counter among clients that have requests waiting, so idle time is not banked as
    credit. The victim is a running request of the most-served client. O(n) pop/peek.
    """

    name = "fair"

    def __init__(self, prefill_weight: float = 1.0, decode_weight: float = 2.0) -> None:
        super().__init__()
        for field, value in (("prefill_weight", prefill_weight), ("decode_weight", decode_weight)):
            if not _is_number(value) or not value >= 0:
                raise ValueError(f"{field}={value!r} must be a number >= 0")
        if prefill_weight == 0 and decode_weight == 0:
            raise ValueError("prefill_weight and decode_weight must not both be 0")
        self.prefill_weight = prefill_weight
        self.decode_weight = decode_weight
        self.counters: dict[str | None, float] = {}
        self._num_waiting: Counter[str | None] = Counter()  # client -> waiting requests

    def add(self, request: Request) -> None:
        client = request.client_id
        if self._num_waiting[client] == 0:
            backlogged = [self.counters.get(c, 0.0) for c, n in self._num_waiting.items() if n]
            if backlogged:
                self.counters[client] = max(self.counters.get(client, 0.0), min(backlogged))
        self._insert(request)

    def prepend(self, request: Request) -> None:
        self._insert(request)  # a preempted request is not a new arrival: no lift

    def _insert(self, request: Request) -> None:
        if request.request_id not in self._reqs:
            self._num_waiting[request.client_id] += 1
        self._reqs[request.request_id] = request

    def pop(self) -> Request:
        request = super().pop()
        self._num_waiting[request.client_id] -= 1
        return request

    def remove(self, request: Request) -> None:
        super().remove(request)
        self._num_waiting[request.client_id] -= 1

    def on_scheduled(self, request: Request, num_prefill_tokens: int,
                     num_decode_tokens: int) -> None:
        service = self.prefill_weight * num_prefill_tokens + self.decode_weight * num_decode_tokens
        self.counters[request.client_id] = self.counters.get(request.client_id, 0.0) + service

    def _key(self, request: Request) -> tuple[Any, ...]:
        return (self.counters.get(request.client_id, 0.0), request.sort_key())

    def victim(self, running: list[Request], kv: KVCacheView | None = None) -> Request:
        return max(running, key=self._key)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)
