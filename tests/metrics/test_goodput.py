"""SLO / goodput edge cases on hand-made records (DistServe: good = meets every bound)."""

import pytest

from lab.core.stats import RequestStats
from lab.metrics.stats import SLO, summarize


def _req(rid, ttft, tpot, e2e, reason="length"):
    return RequestStats(request_id=rid, arrival_time=0.0, ttft=ttft, tpot=tpot,
                        e2e_latency=e2e, finish_reason=reason)


REQS = [
    _req("fast", 0.1, 0.01, 1.0),
    _req("slow_first", 0.9, 0.01, 1.0),
    _req("slow_decode", 0.1, 0.2, 3.0),
    _req("one_token", 0.2, None, 0.2, reason="stop"),  # no TPOT: meets any TPOT bound
    _req("aborted", None, None, 0.5, reason="abort"),  # never good
]


@pytest.mark.parametrize(("slo", "good"), [
    (SLO(), 4),  # no bounds: every normally finished request
    (SLO(ttft_s=0.5), 3),
    (SLO(tpot_s=0.05), 3),
    (SLO(ttft_s=0.5, tpot_s=0.05), 2),
    (SLO(ttft_s=0.5, tpot_s=0.05, e2e_s=0.5), 1),
    (SLO(ttft_s=0.1), 2),  # bounds are inclusive
])
def test_goodput_counts(slo, good):
    s = summarize([], REQS, wall_time=2.0, slo=slo)
    assert s.num_good_requests == good
    assert s.slo_attainment == pytest.approx(good / 5)
    assert s.request_goodput == pytest.approx(good / 2.0)
    assert (s.slo_ttft_s, s.slo_tpot_s, s.slo_e2e_s) == (slo.ttft_s, slo.tpot_s, slo.e2e_s)


def test_goodput_empty_run():
    s = summarize([], [], wall_time=0.0, slo=SLO(ttft_s=1.0))
    assert s.num_good_requests == 0 and s.slo_attainment is None and s.request_goodput is None


def test_slo_from_config():
    assert SLO.from_config({"ttft_s": 1.0, "tpot_s": None}) == SLO(ttft_s=1.0)
    assert SLO.from_config(None) == SLO()
    with pytest.raises(ValueError, match="unknown slo keys"):
        SLO.from_config({"ttft": 1.0})
    with pytest.raises(ValueError, match="positive"):
        SLO.from_config({"tpot_s": -1})
    with pytest.raises(ValueError, match="positive"):
        SLO(e2e_s="1s")


def test_default_config_has_slo_block():
    from lab.config.compose import compose_config

    cfg = compose_config(["slo.e2e_s=5"])
    assert SLO.from_config(cfg.slo) == SLO(ttft_s=None, tpot_s=None, e2e_s=5)  # others off
