"""summarize() arithmetic and RequestStats.from_request on hand-made records."""

import pytest

from lab.core.request import Request, RequestStatus
from lab.core.sampling_params import SamplingParams
from lab.core.stats import RequestStats, StepStats
from lab.metrics.stats import RunSummary, summarize


def _req(i: int, ttft: float, tpot: float | None, itl: list[float], e2e: float, **kw) -> RequestStats:
    defaults = dict(num_prompt_tokens=10, num_output_tokens=5, finish_reason="length")
    return RequestStats(
        request_id=str(i), arrival_time=0.0, ttft=ttft, tpot=tpot, itl=itl, e2e_latency=e2e,
        **{**defaults, **kw},
    )


def _steps() -> list[StepStats]:
    return [
        StepStats(step=0, kv_cache_usage=0.25, prefix_cache_queries=100, prefix_cache_hits=20,
                  num_scheduled_reqs=4, num_preempted=1, preempted_by_strategy={"recompute": 1}),
        StepStats(step=1, kv_cache_usage=0.75, prefix_cache_queries=0, prefix_cache_hits=0,
                  num_scheduled_reqs=2, num_preempted=2, preempted_by_strategy={"swap": 2},
                  swap_out_blocks=6, num_evicted_blocks=1),
        StepStats(step=2, kv_cache_usage=0.5, prefix_cache_queries=60, prefix_cache_hits=60,
                  num_scheduled_reqs=0, swap_in_blocks=6),
    ]


def _requests() -> list[RequestStats]:
    return [
        _req(0, 0.1, 0.01, [0.01, 0.02], 1.0, num_cached_tokens=4),
        _req(1, 0.2, 0.02, [0.03], 2.0),
        _req(2, 0.3, None, [], 3.0, num_output_tokens=1, finish_reason="stop"),
        _req(3, 0.4, 0.04, [0.04], 4.0, num_prompt_tokens=30),
    ]


def test_summarize_exact_values():
    s = summarize(_steps(), _requests(), wall_time=2.0)
    assert s.num_requests == 4 and s.num_steps == 3
    assert s.num_finished == {"length": 3, "stop": 1}
    assert (s.total_prompt_tokens, s.total_output_tokens, s.total_cached_tokens) == (60, 16, 4)
    assert s.output_throughput == pytest.approx(8.0)
    assert s.total_throughput == pytest.approx(38.0)
    assert s.request_throughput == pytest.approx(2.0)
    # numpy linear percentiles of [0.1, 0.2, 0.3, 0.4]
    assert s.ttft_mean == pytest.approx(0.25)
    assert s.ttft_p50 == pytest.approx(0.25)
    assert s.ttft_p90 == pytest.approx(0.37)
    assert s.ttft_p99 == pytest.approx(0.397)
    # tpot skips the None of a 1-token request: [0.01, 0.02, 0.04]
    assert s.tpot_mean == pytest.approx(0.07 / 3)
    assert s.tpot_p50 == pytest.approx(0.02)
    assert s.tpot_p90 == pytest.approx(0.036)
    # itl pools every request's gaps: [0.01, 0.02, 0.03, 0.04]
    assert s.itl_p50 == pytest.approx(0.025)
    assert s.itl_p99 == pytest.approx(0.0397)
    assert s.e2e_mean == pytest.approx(2.5) and s.e2e_p90 == pytest.approx(3.7)


def test_summarize_step_aggregates():
    s = summarize(_steps(), _requests(), wall_time=2.0)
    assert s.peak_kv_cache_usage == 0.75 and s.mean_kv_cache_usage == pytest.approx(0.5)
    assert (s.prefix_cache_queries, s.prefix_cache_hits) == (160, 80)
    assert s.prefix_cache_hit_rate == pytest.approx(0.5)
    assert s.num_preemptions == 3
    assert s.preempted_by_strategy == {"recompute": 1, "swap": 2}
    assert (s.swap_out_blocks, s.swap_in_blocks, s.num_evicted_blocks) == (6, 6, 1)
    assert s.mean_batch_size == pytest.approx(3.0)  # steps that scheduled nothing are skipped


def test_summarize_empty_is_none():
    s = summarize([], [], wall_time=0.0)
    assert isinstance(s, RunSummary) and s.num_requests == 0
    for name in ("ttft_p50", "tpot_mean", "itl_p99", "e2e_p90", "output_throughput",
                 "prefix_cache_hit_rate", "peak_kv_cache_usage", "mean_batch_size"):
        assert getattr(s, name) is None, name
    assert s.to_dict()["num_finished"] == {}


def test_summarize_preemptions_fall_back_to_requests():
    reqs = [_req(0, 0.1, None, [], 1.0, num_preemptions=2), _req(1, 0.1, None, [], 1.0)]
    assert summarize([], reqs, 1.0).num_preemptions == 2


def _finished_request() -> Request:
    req = Request("r1", [5, 6, 7], SamplingParams(max_tokens=4), eos_token_id=2,
                  arrival_time=100.0, priority=3, client_id="c")
    for tok in (8, 9, 10, 11):
        req.append_output_token(tok)
    t = req.times
    t.first_scheduled, t.first_token, t.last_token, t.finished = 100.5, 101.0, 101.6, 101.7
    t.token_times = [101.0, 101.1, 101.3, 101.6]
    t.time_preempted = 0.2
    req.num_cached_tokens, req.num_preemptions = 2, 1
    req.status = RequestStatus.FINISHED_LENGTH_CAPPED
    return req


def test_request_stats_from_request():
    r = RequestStats.from_request(_finished_request(), 99.0, now=200.0)
    assert r.request_id == "r1" and r.priority == 3 and r.client_id == "c"
    assert r.arrival_time == pytest.approx(1.0)
    assert r.first_scheduled_time == pytest.approx(1.5)
    assert r.first_token_time == pytest.approx(2.0)
    assert r.finish_time == pytest.approx(2.7)
    assert r.ttft == pytest.approx(1.0)
    assert r.queue_time == pytest.approx(0.5)
    assert r.e2e_latency == pytest.approx(1.7)
    assert r.tpot == pytest.approx(0.2)  # (101.6 - 101.0) / 3
    assert r.itl == pytest.approx([0.1, 0.2, 0.3])
    assert (r.num_prompt_tokens, r.num_output_tokens, r.num_cached_tokens) == (3, 4, 2)
    assert r.num_preemptions == 1 and r.time_preempted == pytest.approx(0.2)
    assert r.finish_reason == "length"


def test_request_stats_unfinished_and_short():
    req = Request("r2", [5], SamplingParams(), eos_token_id=None, arrival_time=10.0)
    req.num_cached_tokens = -1  # never admitted
    r = RequestStats.from_request(req, 10.0, now=12.0)
    assert r.finish_time == pytest.approx(2.0) and r.e2e_latency == pytest.approx(2.0)
    assert r.ttft is None and r.tpot is None and r.queue_time is None and r.itl == []
    assert r.num_cached_tokens == 0 and r.finish_reason is None
    req.append_output_token(7)
    req.times.first_token = req.times.last_token = 11.0
    assert RequestStats.from_request(req, 10.0, now=12.0).tpot is None  # n < 2
    assert RequestStats.from_request(req, 10.0).finish_time == pytest.approx(1.0)  # last token


def test_to_dict_round_trip():
    st = StepStats(step=3, preempted_by_strategy={"swap": 1})
    assert StepStats(**st.to_dict()) == st
    rq = _requests()[0]
    assert RequestStats(**rq.to_dict()) == rq
