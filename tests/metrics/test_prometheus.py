"""PrometheusLogger on the scripted workload: vLLM's metric names under `lab:`, exact values,
its own registry, /metrics served while the run lasts, the text file at close."""

import urllib.request

import pytest
from prometheus_client import REGISTRY

from lab.metrics.base import StatLogger
from lab.metrics.prometheus import PrometheusLogger
from tests.metrics.scripted import run_script
from tests.waits import WAIT_S

LABELS = {"model_name": "tiny_llama"}


class GaugeSpy(StatLogger):
    """Placed after the Prometheus logger: samples its gauges after every step."""

    def __init__(self, prom: PrometheusLogger) -> None:
        self.prom = prom
        self.samples: list[tuple[float, float, float]] = []
        self.served: str | None = None

    def on_step(self, stats) -> None:
        get = self.prom.registry.get_sample_value
        self.samples.append((get("lab:num_requests_running", LABELS),
                             get("lab:num_requests_waiting", LABELS),
                             get("lab:kv_cache_usage_perc", LABELS)))
        if self.served is None:
            url = f"http://127.0.0.1:{self.prom.server_port}/metrics"
            self.served = urllib.request.urlopen(url, timeout=WAIT_S).read().decode()

    def on_request(self, stats) -> None:
        pass


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("prom")
    prom = PrometheusLogger(port=0)
    spy = GaugeSpy(prom)
    run_script([prom, spy], run_dir, config={"model": {"name": "tiny_llama"}})
    return prom, spy, run_dir


def test_gauges_follow_every_step(scripted):
    _, spy, _ = scripted
    assert spy.samples == [(2, 0, 0.6), (2, 0, 1.0), (2, 1, 1.0), (0, 2, 0.0), (1, 0, 0.4),
                           (0, 0, 0.0)]


def test_counters_exact(scripted):
    prom, _, _ = scripted
    get = prom.registry.get_sample_value
    assert get("lab:prefix_cache_queries_total", LABELS) == 41
    assert get("lab:prefix_cache_hits_total", LABELS) == 16
    assert get("lab:num_preemptions_total", LABELS) == 1
    assert get("lab:prompt_tokens_total", LABELS) == 21  # prefill tokens of steps 0..5
    assert get("lab:generation_tokens_total", LABELS) == 8
    assert get("lab:request_success_total", {**LABELS, "finished_reason": "length"}) == 3


@pytest.mark.parametrize(("name", "count", "total"), [
    ("time_to_first_token_seconds", 3, 1.75),  # 0.25 + 0.75 + 0.75
    ("time_per_output_token_seconds", 3, 1.0),  # 0.25 + 0.5 + 0.25
    ("inter_token_latency_seconds", 5, 1.5),
    ("e2e_request_latency_seconds", 3, 3.25),
    ("request_queue_time_seconds", 3, 0.5),
    ("request_prompt_tokens", 3, 23),
    ("request_generation_tokens", 3, 8),
    ("iteration_tokens_total", 6, 26),
])
def test_histograms_exact(scripted, name, count, total):
    prom, _, _ = scripted
    get = prom.registry.get_sample_value
    assert get(f"lab:{name}_count", LABELS) == count
    assert get(f"lab:{name}_sum", LABELS) == pytest.approx(total)


def test_ttft_buckets(scripted):
    prom, _, _ = scripted
    get = prom.registry.get_sample_value
    assert get("lab:time_to_first_token_seconds_bucket", {**LABELS, "le": "0.1"}) == 0
    assert get("lab:time_to_first_token_seconds_bucket", {**LABELS, "le": "0.25"}) == 1
    assert get("lab:time_to_first_token_seconds_bucket", {**LABELS, "le": "0.75"}) == 3


def test_served_and_written_and_not_global(scripted):
    prom, spy, run_dir = scripted
    assert 'lab:num_requests_running{model_name="tiny_llama"} 2.0' in spy.served
    assert "# TYPE lab:kv_cache_usage_perc gauge" in spy.served
    assert prom.server_port is None  # shut down at close
    assert (run_dir / "metrics.prom").read_text() == prom.exposition()
    assert REGISTRY.get_sample_value("lab:num_preemptions_total", LABELS) is None


def test_two_loggers_do_not_collide(tmp_path):
    a, b = PrometheusLogger(model_name="m", textfile=None), PrometheusLogger(model_name="m")
    for lg in (a, b):
        lg.on_start(tmp_path)
    assert a.registry is not b.registry
    a.close(None)
    assert not (tmp_path / "metrics.prom").exists()
