"""The exact per-step and per-request records of a scripted workload (tests/metrics/scripted.py)
through the real LLMEngine, as an InMemoryLogger receives them, and the summary with goodput."""

import pytest

from lab.metrics import InMemoryLogger, JsonlLogger
from tests.metrics.scripted import run_script

STEP_FIELDS = ("step", "time", "num_running_reqs", "num_waiting_reqs", "num_scheduled_tokens",
               "num_prefill_tokens", "num_decode_tokens", "num_scheduled_reqs", "num_preempted",
               "kv_blocks_used", "kv_blocks_total", "prefix_cache_queries", "prefix_cache_hits",
               "num_evicted_blocks", "num_finished", "num_generated_tokens")
EXPECTED_STEPS = [
    # step time run wait sched pre dec reqs preempt used total  q  hits evict fin gen
    (0, 0.25, 2, 0, 8, 8, 0, 2, 0, 3, 5, 16, 0, 0, 0, 1),
    (1, 0.50, 2, 0, 8, 7, 1, 2, 0, 5, 5, 0, 0, 0, 0, 1),
    (2, 0.75, 2, 1, 2, 1, 1, 2, 0, 5, 5, 7, 4, 0, 0, 2),
    (3, 1.00, 0, 2, 1, 0, 1, 1, 1, 0, 5, 0, 0, 0, 1, 1),
    (4, 1.25, 1, 0, 6, 5, 1, 2, 0, 2, 5, 18, 12, 1, 1, 2),
    (5, 1.50, 0, 0, 1, 0, 1, 1, 0, 0, 5, 0, 0, 0, 1, 1),
]
REQUEST_FIELDS = ("request_id", "arrival_time", "first_scheduled_time", "first_token_time",
                  "finish_time", "ttft", "tpot", "itl", "e2e_latency", "queue_time",
                  "num_prompt_tokens", "num_output_tokens", "num_cached_tokens",
                  "num_preemptions", "time_preempted", "finish_reason")
EXPECTED_REQUESTS = [  # in finishing order
    ("A", 0.0, 0.0, 0.25, 1.0, 0.25, 0.25, [0.25, 0.25, 0.25], 1.0, 0.0, 6, 4, 0, 0, 0.0, "length"),
    ("B", 0.0, 0.0, 0.75, 1.25, 0.75, 0.5, [0.5], 1.25, 0.0, 10, 2, 0, 1, 0.25, "length"),
    ("C", 0.5, 1.0, 1.25, 1.5, 0.75, 0.25, [0.25], 1.0, 0.5, 7, 2, 4, 0, 0.0, "length"),
]


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    mem = InMemoryLogger()
    run_dir = tmp_path_factory.mktemp("scripted")
    summary = run_script([mem, JsonlLogger()], run_dir)
    return mem, summary, run_dir


def test_step_records_exact(scripted):
    mem, _, _ = scripted
    got = [tuple(getattr(s, f) for f in STEP_FIELDS) for s in mem.steps]
    assert got == EXPECTED_STEPS
    assert [s.preempted_by_strategy for s in mem.steps] == [{}, {}, {}, {"recompute": 1}, {}, {}]
    assert [s.kv_cache_usage for s in mem.steps] == [0.6, 1.0, 1.0, 0.0, 0.4, 0.0]
    assert all(s.num_swapped_reqs == 0 and s.swap_out_blocks == 0 for s in mem.steps)


def test_request_records_exact(scripted):
    mem, _, _ = scripted
    got = [tuple(getattr(r, f) for f in REQUEST_FIELDS) for r in mem.requests]
    assert got == EXPECTED_REQUESTS
    assert mem.total_requests == 3 and mem.config == {"script": "abc"}


def test_summary_and_goodput_exact(scripted):
    _, s, _ = scripted
    assert (s.num_requests, s.num_steps, s.wall_time) == (3, 6, 1.5)
    assert (s.total_prompt_tokens, s.total_output_tokens, s.total_cached_tokens) == (23, 8, 4)
    assert s.output_throughput == pytest.approx(8 / 1.5)
    assert s.request_throughput == pytest.approx(2.0)
    assert (s.ttft_p50, s.ttft_p99) == (0.75, 0.75)
    assert s.tpot_p50 == 0.25 and s.tpot_p99 == pytest.approx(0.495)  # tpot [0.25, 0.5, 0.25]
    assert (s.e2e_p50, s.e2e_p99) == (1.0, pytest.approx(1.245))
    assert s.itl_p50 == 0.25 and s.itl_mean == pytest.approx(0.3)  # [.25, .25, .25, .5, .25]
    assert (s.num_preemptions, s.preempted_by_strategy) == (1, {"recompute": 1})
    assert (s.prefix_cache_queries, s.prefix_cache_hits) == (41, 16)
    assert s.prefix_cache_hit_rate == pytest.approx(16 / 41)
    assert (s.peak_kv_cache_usage, s.mean_kv_cache_usage) == (1.0, pytest.approx(0.5))
    # SLO TTFT <= 0.5 s, TPOT <= 0.25 s: only A (TTFT 0.25, TPOT 0.25) meets both;
    # B misses both (0.75, 0.5), C misses TTFT (0.75)
    assert (s.slo_ttft_s, s.slo_tpot_s, s.slo_e2e_s) == (0.5, 0.25, None)
    assert s.num_good_requests == 1
    assert s.slo_attainment == pytest.approx(1 / 3)
    assert s.request_goodput == pytest.approx(1 / 1.5)


def test_jsonl_holds_the_same_records(scripted):
    import json

    mem, summary, run_dir = scripted
    steps = [json.loads(x) for x in (run_dir / "steps.jsonl").read_text().splitlines()]
    reqs = [json.loads(x) for x in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert steps == [s.to_dict() for s in mem.steps]
    assert reqs == [r.to_dict() for r in mem.requests]
    assert json.loads((run_dir / "summary.json").read_text()) == summary.to_dict()
