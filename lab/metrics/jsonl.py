"""JsonlLogger: `steps.jsonl` and `requests.jsonl` written as the run goes, `summary.json` at close.

One JSON object per line, keys exactly the dataclass fields (`StepStats.to_dict()`, ...).
The engine writes the resolved config itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

from lab.core.stats import RequestStats, StepStats
from lab.metrics.base import StatLogger
from lab.metrics.stats import RunSummary

STEPS_FILE = "steps.jsonl"
REQUESTS_FILE = "requests.jsonl"
SUMMARY_FILE = "summary.json"


class JsonlLogger(StatLogger):
    """Appends one line per step / finished request; flushes every `flush_every` records."""

    def __init__(self, flush_every: int = 1) -> None:
        if not isinstance(flush_every, int) or flush_every < 1:
            raise ValueError(f"JsonlLogger.flush_every={flush_every!r} must be an integer >= 1")
        self.flush_every = flush_every
        self.run_dir: Path | None = None
        self._files: dict[str, IO[str]] = {}
        self._pending: dict[str, int] = {}

    def on_start(self, run_dir: Path, config=None, total_requests=None) -> None:
        super().on_start(run_dir, config, total_requests)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for name in (STEPS_FILE, REQUESTS_FILE):
            self._files[name] = open(self.run_dir / name, "w", encoding="utf-8")
            self._pending[name] = 0

    def on_step(self, stats: StepStats) -> None:
        self._write(STEPS_FILE, stats.to_dict())

    def on_request(self, stats: RequestStats) -> None:
        self._write(REQUESTS_FILE, stats.to_dict())

    def close(self, summary: RunSummary) -> None:
        if self.run_dir is None:
            raise RuntimeError("JsonlLogger.close() called before on_start()")
        for f in self._files.values():
            f.close()
        self._files.clear()
        text = json.dumps(summary.to_dict(), indent=2)
        (self.run_dir / SUMMARY_FILE).write_text(text + "\n", encoding="utf-8")

    def _write(self, name: str, record: dict[str, Any]) -> None:
        f = self._files.get(name)
        if f is None:
            raise RuntimeError(f"JsonlLogger: on_start() must come before writing {name}")
        f.write(json.dumps(record) + "\n")
        self._pending[name] += 1
        if self._pending[name] >= self.flush_every:
            f.flush()
            self._pending[name] = 0
