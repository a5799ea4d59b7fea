"""Queue policies (the `scheduler` config group): who goes next, who is preempted.

A policy only orders requests; the budgets, chunking and allocation live in `Scheduler`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator

from lab.engine.request import Request


class RequestQueue(ABC):
    """Base class of the `scheduler` group: the waiting queue and the choice of victim."""

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
    def victim(self, running: list[Request]) -> Request:
        """The running request to preempt when memory runs short."""

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

    def victim(self, running: list[Request]) -> Request:
        return running[-1]
