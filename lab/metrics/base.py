"""The StatLogger seam: where an engine's per-step and per-request statistics go.

The engine builds every logger chosen under `lab/conf/logger/` (Hydra `_target_`, one key per logger,
e.g. `logger=[console,jsonl]`) and calls, in order:

    on_start(run_dir, config, total_requests)  once, before the first step
    on_step(StepStats)                          after every engine step
    on_request(RequestStats)                    for every finished request
    close(RunSummary)                           once, at the end of the run
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from lab.core.stats import RequestStats, StepStats
from lab.metrics.stats import RunSummary


class StatLogger(ABC):
    """Base of the `logger` config group: a sink for StepStats, RequestStats and a RunSummary."""

    def on_start(
        self,
        run_dir: Path,
        config: dict[str, Any] | None = None,
        total_requests: int | None = None,
    ) -> None:
        """Called once before the first step with the run directory and the resolved config.

        `total_requests`, when known, sizes progress displays (same as `set_total`). Subclasses
        extend it with `super().on_start(...)`; it records `run_dir` and `config`.
        """
        self.run_dir: Path | None = Path(run_dir)
        self.config = config
        if total_requests is not None:
            self.set_total(total_requests)

    def set_total(self, n: int) -> None:  # noqa: B027 - optional hook
        """Tell the logger how many requests the run will finish (for progress bars)."""

    @abstractmethod
    def on_step(self, stats: StepStats) -> None:
        """Record the statistics of one engine step."""

    @abstractmethod
    def on_request(self, stats: RequestStats) -> None:
        """Record one finished request."""

    def close(self, summary: RunSummary) -> None:  # noqa: B027 - optional hook
        """Called once at the end of the run with the aggregates; flush and release resources."""
