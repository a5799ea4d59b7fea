"""What the executors that run one worker per rank (multiproc, ray) share.

The engine sees one executor; behind it every rank runs the same Worker on the same calls:

    model_info            rank 0's (every rank loads the same config; the KV bytes are per rank)
    determine_num_blocks  the minimum over ranks (each sized its cache from its own memory)
    initialize_cache      on every rank
    execute_model         the SchedulerOutput to every rank; rank 0's ModelRunnerOutput back
                          (the others take part in the step's collectives and return nothing)

A rank that raises or dies leaves the others waiting in a collective that never completes, so
any failure is fatal to the whole group: the executor kills every rank, raises
`RankFailedError` naming the rank (a dead one before one that only saw its peer vanish), and
every later call raises it again at once.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lab.core.model_info import ModelInfo
from lab.executor.base import Executor

if TYPE_CHECKING:
    from lab.cache.sizing import CacheSizing

POLL_S = 0.1  # how often a waiting executor checks that every rank is alive
STARTUP_TIMEOUT_S = 900.0  # loading a big checkpoint on every rank takes a while


class RankFailedError(RuntimeError):
    """A rank of a multiproc / ray executor raised or died; the group was stopped."""


class DistributedExecutor(Executor):
    """The rank-parallel executors' common calls, over their `collective_rpc`."""

    supports_tensor_parallel = True

    @abstractmethod
    def collective_rpc(
        self, method: str | Callable, args: tuple = (), kwargs: dict | None = None,
    ) -> list[Any]:
        """Run `Worker.<method>` on every rank; the results in rank order (RankFailedError
        naming the rank when one raises or dies)."""

    def model_info(self) -> ModelInfo:
        if getattr(self, "_model_info", None) is None:
            self._model_info = self.collective_rpc("model_info")[0]
        return self._model_info

    def determine_num_blocks(self, sizing: CacheSizing) -> int:
        return min(self.collective_rpc("determine_num_blocks", (sizing,)))

    def initialize_cache(
        self, num_blocks: int, max_model_len: int, num_swap_blocks: int = 0
    ) -> None:
        self.collective_rpc("initialize_cache", (num_blocks, max_model_len, num_swap_blocks))


def rank_failure(rank: int, what: str, dead: dict[int, str]) -> str:
    """The message of a failed group: ranks found dead first (a peer's error is often only the
    echo of their death: gloo's "connection closed"), then the rank that reported `what`."""
    if dead and rank not in dead:
        first = min(dead)
        return (f"rank {first} {dead[first]}; the group was stopped (rank {rank} then "
                f"failed: {what.strip().splitlines()[-1] if what.strip() else what})")
    return f"rank {rank} {dead.get(rank, f'failed: {what}')}; the group was stopped"
