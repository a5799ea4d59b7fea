"""Per-priority TTFT in the run summary and the console table; the goodput row without SLOs."""

import json

from rich.console import Console

from lab.core.stats import RequestStats
from lab.metrics.console import summary_table
from lab.metrics.stats import SLO, summarize


def _req(i: int, priority: int, ttft: float | None) -> RequestStats:
    return RequestStats(request_id=str(i), arrival_time=0.0, ttft=ttft, e2e_latency=1.0,
                        priority=priority, num_output_tokens=2, finish_reason="length")


REQS = [_req(0, 1, 0.4), _req(1, 0, 0.1), _req(2, 1, 0.8), _req(3, 0, 0.3), _req(4, 1, None)]


def _text(table) -> str:
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


def test_ttft_by_priority_counts_and_percentiles_per_class():
    s = summarize([], REQS, wall_time=1.0)
    assert list(s.ttft_by_priority) == ["0", "1"]
    p0, p1 = s.ttft_by_priority["0"], s.ttft_by_priority["1"]
    assert p0["count"] == 2 and p0["mean"] == 0.2 and p0["p50"] == 0.2
    assert abs(p0["p90"] - 0.28) < 1e-12 and abs(p0["p99"] - 0.298) < 1e-12
    assert p1["count"] == 3 and abs(p1["mean"] - 0.6) < 1e-12 and abs(p1["p50"] - 0.6) < 1e-12
    assert json.loads(json.dumps(s.to_dict()))["ttft_by_priority"] == s.ttft_by_priority


def test_console_shows_ttft_per_priority_and_says_when_no_slo_is_set():
    text = _text(summary_table(summarize([], REQS, wall_time=1.0)))
    assert "TTFT priority 0" in text and "200.0 / 298.0 ms, 2 req" in text
    assert "TTFT priority 1" in text and "no SLO set" in text
    single = _text(summary_table(summarize([], REQS[1:2], 1.0, SLO(ttft_s=0.5))))
    assert "TTFT priority" not in single and "100.0% met TTFT<=500ms" in single
