"""Statistics: StepStats / RequestStats / RunSummary and the StatLogger plug-ins."""

from lab.core.stats import RequestStats, StepStats
from lab.metrics.base import StatLogger
from lab.metrics.console import ConsoleLogger
from lab.metrics.jsonl import JsonlLogger
from lab.metrics.memory import InMemoryLogger
from lab.metrics.stats import SLO, RunSummary, summarize

__all__ = [
    "ConsoleLogger",
    "InMemoryLogger",
    "JsonlLogger",
    "RequestStats",
    "RunSummary",
    "SLO",
    "StatLogger",
    "StepStats",
    "summarize",
]
