"""The fault soak's verdict and table (lab/bench/serve_faults.py), on made-up results; the soak
itself starts five servers, so its run is in the slow profile."""

from collections import Counter

import pytest

from lab.bench.serve_faults import Tally, main, report, verdict


def _results(**change) -> dict:
    ok = {
        "load": {"tally": Tally(Counter(ok=10, left=2, failed=3)), "kv_blocks_leaked": 0,
                 "health_p99_ms_during_big_bodies": 30.0},
        "cancel": {"tally": Tally(Counter(ok=1, left=1)), "generation_stopped_after_s": 0.0},
        "kill": {"tally": Tally(Counter(failed=8)), "server_exit_code": 1, "ipc_dirs_left": 0},
        "sigterm": {"tally": Tally(Counter(ok=5, refused=2)), "server_exit_code": 0,
                    "exit_s": 1.0, "grace_s": 2.0, "ipc_dirs_left": 0},
    }
    for key, value in change.items():
        phase, field = key.split("__")
        ok[phase][field] = value
    return ok


def test_a_clean_soak_passes_and_its_table_has_a_row_per_phase():
    assert verdict(_results()) == []
    lines = report(_results())
    assert lines[0].split()[:8] == ["phase", "sent", "ok", "left", "failed", "refused", "wrong",
                                    "hung"]
    assert [line.split()[0] for line in lines[1:]] == ["load", "cancel", "kill", "sigterm"]


@pytest.mark.parametrize("change, says", [
    ({"load__tally": Tally(Counter(ok=3, hung=1))}, "1 hung"),
    ({"kill__tally": Tally(Counter(failed=7, wrong=1), ["500"])}, "1 wrong"),
    ({"load__kv_blocks_leaked": 2}, "2 KV blocks leaked"),
    ({"load__health_p99_ms_during_big_bodies": 150.0}, "/health p99 150.0 ms"),
    ({"cancel__generation_stopped_after_s": 5.0}, "went on 5.0 s"),
    ({"kill__server_exit_code": 0}, "server exit 0"),
    ({"kill__ipc_dirs_left": 1}, "1 IPC dirs left"),
    ({"sigterm__server_exit_code": -15}, "sigterm: exit -15"),
    ({"sigterm__exit_s": 30.0}, "after 30.0 s"),
])
def test_each_broken_promise_fails_the_soak(change, says):
    bad = verdict(_results(**change))
    assert len(bad) == 1 and says in bad[0], bad


def test_the_soak_refuses_a_stop_longer_than_the_core_timeout():
    with pytest.raises(SystemExit, match="--stop-s"):
        main(["--stop-s", "5", "--core-timeout", "4"])
    with pytest.raises(SystemExit, match="unknown"):
        main(["--phases", "load,nope"])


@pytest.mark.slow
def test_a_short_soak_passes(capsys):
    main(["--seconds", "5", "--clients", "4"])
    assert capsys.readouterr().out.rstrip().endswith("PASS")
