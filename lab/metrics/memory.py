"""InMemoryLogger: keeps every record in lists (tests and the offline API read them back)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lab.core.stats import RequestStats, StepStats
from lab.metrics.base import StatLogger
from lab.metrics.stats import RunSummary


class InMemoryLogger(StatLogger):
    """Stores steps, finished requests and the summary as Python objects."""

    def __init__(self) -> None:
        self.run_dir: Path | None = None
        self.config: dict[str, Any] | None = None
        self.total_requests: int | None = None
        self.steps: list[StepStats] = []
        self.requests: list[RequestStats] = []
        self.summary: RunSummary | None = None

    def set_total(self, n: int) -> None:
        self.total_requests = n

    def on_step(self, stats: StepStats) -> None:
        self.steps.append(stats)

    def on_request(self, stats: RequestStats) -> None:
        self.requests.append(stats)

    def close(self, summary: RunSummary) -> None:
        self.summary = summary
