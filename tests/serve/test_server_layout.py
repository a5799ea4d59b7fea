"""The server's shape: it reaches the engine only through AsyncLLM's public API (no
`async_llm.engine`, no private attribute of another object), and /metrics serves the engine's
own PrometheusLogger when it has one (else one added through add_stat_logger)."""

import ast
from pathlib import Path

import lab.serve
from lab.metrics.prometheus import PrometheusLogger
from lab.serve.api_server import build_app

SERVE = Path(lab.serve.__file__).parent


def test_the_server_uses_only_asyncllms_public_api():
    found = []
    for path in sorted(SERVE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            private = node.attr.startswith("_") and not node.attr.startswith("__")
            if node.attr == "engine" or private:
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert not found, found


class FakeAsyncLLM:
    """The part of AsyncLLM's public API build_app uses."""

    model_path = "checkpoint"

    def __init__(self, loggers):
        self.stat_loggers = tuple(loggers)

    def add_stat_logger(self, logger):
        self.stat_loggers += (logger,)


def test_metrics_serve_the_engines_own_prometheus_logger():
    own = PrometheusLogger("m", textfile=None)
    llm = FakeAsyncLLM([own])
    assert build_app(llm, "m").state.server.prometheus is own
    assert llm.stat_loggers == (own,)  # nothing added


def test_metrics_add_a_prometheus_logger_when_the_engine_has_none():
    llm = FakeAsyncLLM([])
    prom = build_app(llm, "m").state.server.prometheus
    assert isinstance(prom, PrometheusLogger) and llm.stat_loggers == (prom,)
