"""Two scheduling policies (the `scheduler` group; base class lab.scheduler.queues.RequestQueue).

- `scheduler=las`: least attained service first. Waiting requests go in order of the tokens
  they have already generated (a preempted request has some; a new one none), then arrival; the
  victim of a preemption is the running request that has generated the most. Background requests
  (priority > 0) get at most `background_chunk_tokens` tokens a step (a per-request token cap).
- `scheduler=frees_most`: first come, first served, but the victim is the running request whose
  preemption frees the most KV blocks (blocks it shares with another request free nothing),
  read from the cache's view the scheduler passes to `victim`.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from lab.cache.view import KVCacheView
from lab.core.request import Request
from lab.scheduler.queues import FCFSQueue, RequestQueue


class LeastAttainedService(RequestQueue):
    """Least attained service (LAS) with per-request token caps for background requests."""

    name = "las"

    def __init__(self, background_chunk_tokens: int = 64) -> None:
        if background_chunk_tokens < 1:
            raise ValueError(f"background_chunk_tokens={background_chunk_tokens} must be >= 1")
        self.background_chunk_tokens = background_chunk_tokens
        self._keys: list[tuple] = []  # sorted (attained, arrival order key) of waiting requests
        self._by_key: dict[tuple, Request] = {}

    @staticmethod
    def key(request: Request) -> tuple:
        """Tokens generated so far, then the request's own order (arrival, id)."""
        return (request.num_output_tokens, request.sort_key())

    def add(self, request: Request) -> None:
        key = self.key(request)
        bisect.insort(self._keys, key)
        self._by_key[key] = request

    prepend = add  # a preempted request keeps its attained service: the order places it

    def pop(self) -> Request:
        return self._by_key.pop(self._keys.pop(0))

    def peek(self) -> Request:
        return self._by_key[self._keys[0]]

    def remove(self, request: Request) -> None:
        key = next((k for k, r in self._by_key.items() if r is request), None)
        if key is None:
            raise ValueError(f"request {request.request_id!r} is not waiting")
        self._keys.remove(key)
        del self._by_key[key]

    def __iter__(self) -> Iterator[Request]:
        return iter([self._by_key[k] for k in self._keys])

    def __len__(self) -> int:
        return len(self._keys)

    def victim(self, running: list[Request], kv: KVCacheView | None = None) -> Request:
        """The request that has been served most (the newest among equals)."""
        return max(reversed(running), key=lambda r: r.num_output_tokens)

    def token_cap(self, request: Request) -> int | None:
        return self.background_chunk_tokens if request.priority > 0 else None


class FreesMostBlocks(FCFSQueue):
    """FCFS order; the victim frees the most KV blocks (the newest among equals)."""

    name = "frees_most"

    def victim(self, running: list[Request], kv: KVCacheView | None = None) -> Request:
        if kv is None:
            return super().victim(running)
        return max(reversed(running), key=lambda r: kv.blocks_of(r).num_freed_blocks)
