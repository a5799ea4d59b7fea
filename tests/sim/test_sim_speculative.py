"""Speculative decoding under `executor=sim` (lab/sim/spec.py): drafts proposed and capped as the
real runner caps them, verifications accepted at the `sim.spec` rate (geometric, or a real run's
measured curve), seeded, priced as their real shape plus the proposer's forwards, and step
statistics that add up."""

import json
from dataclasses import replace

import numpy as np
import pytest

from lab.config.compose import compose_config
from lab.config.validate import validate_knobs
from lab.core.sampling_params import SamplingParams
from lab.core.step import StepShape
from lab.engine.llm_engine import LLMEngine
from lab.engine.replay import replay
from lab.metrics.jsonl import JsonlLogger
from lab.metrics.memory import InMemoryLogger
from lab.scheduler import scheduler as scheduler_module
from lab.sim.configs import write_configs
from lab.sim.knobs import SimSpecKnobs
from lab.sim.spec import Acceptance, SimSpeculation, measured_acceptance
from lab.workloads.base import WorkloadRequest
from lab.workloads.synthetic import SyntheticWorkload

CONSTANT = ["sim/step_time=constant", "sim.step_time.seconds=0.01"]


def decode_heavy(n: int = 8, prompt: int = 32, output: int = 64) -> SyntheticWorkload:
    """n requests of `prompt` tokens and `output` outputs each, all at t=0."""
    return SyntheticWorkload(num_requests=n, prompt_len=prompt, output_len=output,
                             arrival="batch", seed=0)


def simulate(*overrides: str, workload: SyntheticWorkload | None = None,
             requests: list[WorkloadRequest] | None = None, jsonl_dir=None):
    """(summary, steps, requests' stats, engine) of a simulated run of tiny_llama."""
    engine = LLMEngine(compose_config(["executor=sim", "logger=[]", "seed=0", *overrides]))
    if jsonl_dir is not None:
        logger = JsonlLogger()
        logger.on_start(jsonl_dir)
        engine.loggers.append(logger)
    recorder = InMemoryLogger()
    engine.loggers.append(recorder)
    try:
        reqs = requests or (workload or decode_heavy()).requests(
            engine.model_info.vocab_size, engine.eos_token_id)
        summary = replay(engine, reqs)
        if jsonl_dir is not None:
            logger.close(summary)
    finally:
        engine.shutdown()
    return summary, recorder.steps, recorder.requests, engine


def total(steps, field: str) -> int:
    return sum(getattr(s, field) for s in steps)


def spec(k: int, alpha: float, *more: str) -> list[str]:
    return ["speculative=ngram", f"speculative.num_speculative_tokens={k}",
            f"sim.spec.acceptance_rate={alpha}", *more]


# -- the acceptance model ----------------------------------------------------------------------
def test_geometric_acceptance_draws_the_expected_accepted_length():
    acc = Acceptance.geometric(0.5, 3, seed=1)
    draws = np.array([acc.draw(3) for _ in range(20000)])
    assert acc.expected(3) == pytest.approx(0.5 + 0.25 + 0.125)
    assert draws.mean() == pytest.approx(0.875, abs=0.03)
    for j in range(1, 4):  # P(first j accepted) = alpha^j
        assert (draws >= j).mean() == pytest.approx(0.5 ** j, abs=0.015)
    assert Acceptance.geometric(0.0, 3).draw(3) == 0
    assert Acceptance.geometric(1.0, 3).draw(2) == 2


def test_acceptance_refuses_a_curve_that_rises():
    with pytest.raises(ValueError, match="non-increasing"):
        Acceptance([0.3, 0.5])


# -- alpha 0 and 1 end to end ------------------------------------------------------------------
def test_acceptance_zero_verifies_every_step_and_keeps_nothing_paying_the_verify_cost():
    per_token = ["sim.step_time.per_token=0.001"]
    off, off_steps, _, _ = simulate(*CONSTANT, *per_token)
    on, on_steps, _, _ = simulate(*CONSTANT, *per_token, *spec(3, 0.0))
    assert total(on_steps, "num_spec_reqs") > 0 and total(on_steps, "num_accepted_tokens") == 0
    assert all(s.num_generated_tokens == s.num_sampled_reqs for s in on_steps)  # 1 per request
    assert len(on_steps) == len(off_steps)  # the same steps as without speculation ...
    drafts = total(on_steps, "num_draft_tokens")
    # 3 a verification, but the last two of each of the 8 requests: max_tokens - 1 left 2, 1
    assert drafts == 3 * total(on_steps, "num_spec_reqs") - 8 * (1 + 2)
    # ... each verified draft one more token computed: constant x steps + per_token x tokens
    assert on.wall_time - off.wall_time == pytest.approx(0.001 * drafts)
    assert on.total_output_tokens == off.total_output_tokens


def test_acceptance_one_keeps_every_draft():
    _, steps, _, _ = simulate(*CONSTANT, *spec(3, 1.0))
    assert total(steps, "num_spec_reqs") > 0
    assert all(s.num_accepted_tokens == s.num_draft_tokens for s in steps)
    off_steps = simulate(*CONSTANT)[1]
    assert len(steps) < len(off_steps) / 3  # ~4 tokens a step


def test_acceptance_half_matches_the_geometric_expectation_and_is_seeded():
    run = spec(3, 0.5)
    _, steps, _, _ = simulate(*CONSTANT, *run, workload=decode_heavy(32, 16, 256))
    mean = total(steps, "num_accepted_tokens") / total(steps, "num_spec_reqs")
    assert mean == pytest.approx(0.5 + 0.25 + 0.125, abs=0.05)
    again = simulate(*CONSTANT, *run, workload=decode_heavy(32, 16, 256))[1]
    assert [s.num_accepted_tokens for s in again] == [s.num_accepted_tokens for s in steps]
    other = simulate(*CONSTANT, *run, "seed=1", workload=decode_heavy(32, 16, 256))[1]
    assert [s.num_accepted_tokens for s in other] != [s.num_accepted_tokens for s in steps]


# -- statistics and caps -----------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_accepted_tokens_are_the_emitted_tokens_beyond_one_per_request(alpha):
    summary, steps, reqs, _ = simulate(*CONSTANT, *spec(4, alpha),
                                       workload=decode_heavy(12, 24, 61))
    for s in steps:
        assert s.num_accepted_tokens == s.num_generated_tokens - s.num_sampled_reqs
        assert s.num_accepted_tokens == sum(s.accepted_per_position)
    assert total(steps, "num_generated_tokens") == summary.total_output_tokens == 12 * 61
    assert sum(r.num_accepted_tokens for r in reqs) == total(steps, "num_accepted_tokens")
    assert all(r.num_output_tokens == 61 for r in reqs)


def test_drafts_are_capped_by_max_tokens_and_max_model_len():
    prompt = list(range(10, 30))
    reqs = [WorkloadRequest(prompt[:10], SamplingParams(max_tokens=5, ignore_eos=True),
                            request_id="short"),
            WorkloadRequest(prompt[:-1], SamplingParams(max_tokens=100, ignore_eos=True),
                            request_id="long")]
    _, steps, stats, _ = simulate(*CONSTANT, *spec(5, 1.0), "max_model_len=23",
                                  requests=reqs)
    out = {r.request_id: r for r in stats}
    # short: 1 token from its prefill, 3 drafts (max_tokens 5 - 1 - 1) all kept + 1 = 5
    assert out["short"].num_output_tokens == 5 and out["short"].num_draft_tokens == 3
    # long: 19 + 1 tokens; the step may compute up to position 21 (< 23 - 1): 2 drafts
    assert out["long"].num_output_tokens == 23 - 19
    assert len(steps) == 2 and steps[1].num_draft_tokens == 3 + 2


def test_requests_a_logits_processor_acts_on_get_no_drafts():
    reqs = [WorkloadRequest(list(range(10, 26)),
                            SamplingParams(max_tokens=20, ignore_eos=True, **extra),
                            request_id=rid)
            for rid, extra in (("plain", {}), ("penalized", {"presence_penalty": 0.5}))]
    _, _, stats, _ = simulate(*CONSTANT, *spec(3, 1.0), requests=reqs)
    out = {r.request_id: r for r in stats}
    assert out["plain"].num_draft_tokens > 0 and out["penalized"].num_draft_tokens == 0


# -- the step's shape and its price ------------------------------------------------------------
def test_a_verifying_request_is_a_sampling_chunk_of_one_plus_its_drafts():
    _, steps, _, _ = simulate(*CONSTANT, *spec(3, 0.0), workload=decode_heavy(4, 16, 8))
    verify = [s for s in steps if s.num_spec_reqs]
    assert verify
    for s in verify:  # each request verifies its drafts: q = 1 + drafts after its context
        assert s.num_decode_reqs == 0 and s.num_prefill_reqs == s.num_spec_reqs
        assert s.num_sampled_reqs == s.num_spec_reqs
        assert all(q >= 2 for q, _ in s.prefill_chunks)
        assert s.num_scheduled_tokens == s.num_spec_reqs + s.num_draft_tokens
    # 3 drafts each but near max_tokens (the last two verifications of a request)
    full = [s for s in verify if s.num_draft_tokens == 3 * s.num_spec_reqs]
    assert full and all(s.max_query_len == 4 for s in full)


def test_the_roofline_prices_the_verify_and_the_draft_models_forwards(tmp_path):
    llama = write_configs(tmp_path, ["llama3_8b"])["llama3_8b"]
    model = ["model=hf", f"model.path={llama}"]
    work = decode_heavy(8, 64, 64)
    off, off_steps, _, _ = simulate(*model, workload=work)
    zero, zero_steps, _, _ = simulate(*model, *spec(3, 0.0), workload=work)
    assert len(zero_steps) == len(off_steps)
    # verifying 3 drafts per request costs more than a decode, but far less than 4 decodes:
    # the weights are read once a step either way
    assert off.wall_time < zero.wall_time < 1.2 * off.wall_time
    costly = simulate(*model, *spec(3, 0.0, "sim.spec.draft_cost_ratio=0.1"), workload=work)[0]
    # 3 draft forwards of 0.1 target decode step on about every step
    assert costly.wall_time == pytest.approx(zero.wall_time + 0.3 * off.wall_time, rel=0.1)


def test_draft_cost_is_the_ratio_times_a_decode_step_per_draft_position():
    one = decode_heavy(1, 16, 40)
    free, steps, _, _ = simulate(*CONSTANT, *spec(3, 1.0), workload=one)
    paid, paid_steps, _, _ = simulate(*CONSTANT, *spec(3, 1.0, "sim.spec.draft_cost_ratio=0.1"),
                                      workload=one)
    assert [s.num_accepted_tokens for s in paid_steps] == [s.num_accepted_tokens for s in steps]
    # one request: the drafts each step proposes are the next step's verified ones
    assert paid.wall_time - free.wall_time == pytest.approx(
        0.1 * 0.01 * total(steps, "num_draft_tokens"))


def test_throughput_rises_with_the_acceptance_rate_on_a_decode_heavy_workload(tmp_path):
    llama = write_configs(tmp_path, ["llama3_8b"])["llama3_8b"]
    model = ["model=hf", f"model.path={llama}"]
    work = decode_heavy(16, 64, 128)
    tps = [simulate(*model, *(spec(3, a) if a is not None else []), workload=work)[0]
           .output_throughput for a in (None, 0.3, 0.6, 0.9)]
    assert tps == sorted(tps) and tps[-1] > 2 * tps[0], tps


# -- a measured acceptance curve ---------------------------------------------------------------
def test_measured_acceptance_is_read_back_from_a_runs_steps_jsonl(tmp_path):
    _, steps, _, _ = simulate(*CONSTANT, *spec(3, 0.8), workload=decode_heavy(32, 16, 128),
                              jsonl_dir=tmp_path)
    measured = measured_acceptance(tmp_path)  # the run directory; the file works as well
    assert measured == measured_acceptance(tmp_path / "steps.jsonl")
    n = total(steps, "num_spec_reqs")
    assert measured == tuple(sum(s.accepted_per_position[j] for s in steps) / n
                             for j in range(3))
    assert measured == pytest.approx([0.8, 0.64, 0.512], abs=0.04)
    # a simulation driven by it accepts at its rates
    _, again, _, _ = simulate(*CONSTANT, "speculative=ngram", "speculative.num_speculative_tokens=2",
                              f"sim.spec.acceptance_from={tmp_path}",
                              workload=decode_heavy(32, 16, 128))
    n = total(again, "num_spec_reqs")
    rates = [sum(s.accepted_per_position[j] for s in again) / n for j in range(2)]
    assert rates == pytest.approx(measured[:2], abs=0.04)


def test_a_handwritten_steps_file_gives_its_per_position_rates(tmp_path):
    path = tmp_path / "steps.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"num_spec_reqs": 0, "accepted_per_position": [0, 0]},
        {"num_spec_reqs": 4, "accepted_per_position": [3, 1]},
        {"num_spec_reqs": 6, "accepted_per_position": [3, 2]}]) + "\n")
    assert measured_acceptance(path) == (0.6, 0.3)
    knobs = SimSpecKnobs(acceptance_from=str(path))
    sim = SimSpeculation.of(2, knobs)
    assert sim.acceptance.survival == (0.6, 0.3)
    assert sim.acceptance.conditional.tolist() == pytest.approx([0.6, 0.5])
    with pytest.raises(ValueError, match="measured 2 draft positions"):
        SimSpeculation.of(3, knobs)
    path.write_text(json.dumps({"num_spec_reqs": 0, "accepted_per_position": []}) + "\n")
    with pytest.raises(ValueError, match="no step verified drafts"):
        measured_acceptance(path)


# -- the knobs ---------------------------------------------------------------------------------
def test_the_sim_spec_block_is_checked_like_every_knob():
    validate_knobs(compose_config(["executor=sim", "sim.spec.acceptance_rate=0.9"]))
    with pytest.raises(ValueError, match=r"sim.spec.acceptance_rate=1.5 is invalid"):
        validate_knobs(compose_config(["sim.spec.acceptance_rate=1.5"]))
    with pytest.raises(ValueError, match="unknown setting 'sim.spec.alpha'"):
        validate_knobs(compose_config(["+sim.spec.alpha=0.5"]))
    with pytest.raises(ValueError, match="unknown setting 'sim.bogus'"):
        validate_knobs(compose_config(["+sim.bogus=1"]))


@pytest.mark.xfail(
    not hasattr(scheduler_module, "SpecDecodeCounts"), strict=True,
    reason="scheduler bug on this branch, fixed on main (SpecDecodeCounts, counted at the update): "
           "under async scheduling a verification is counted into the events of the step "
           "scheduled behind it, lost when that schedule has no work (every request waits for "
           "its tokens in flight)")
def test_async_scheduling_keeps_the_statistics_whole():
    summary, steps, reqs, _ = simulate(*CONSTANT, *spec(3, 0.6), "async_scheduling=true",
                                       workload=decode_heavy(8, 24, 40))
    assert total(steps, "num_spec_reqs") > 0
    assert total(steps, "num_accepted_tokens") == (total(steps, "num_generated_tokens")
                                                   - total(steps, "num_sampled_reqs"))
    assert all(r.num_output_tokens == 40 for r in reqs) and len(reqs) == 8


def test_the_roofline_scores_one_lm_head_row_per_verified_draft(tmp_path):
    llama = write_configs(tmp_path, ["llama3_8b"])["llama3_8b"]
    engine = LLMEngine(compose_config(["executor=sim", "logger=[]", "model=hf",
                                       f"model.path={llama}"]))
    roofline = engine.executor.step_time
    verify = StepShape.of([(4, 100, 104)] * 8)  # 8 requests verifying 3 drafts each
    flops, _ = roofline.linear(verify)
    counted, _ = roofline.linear(replace(verify, num_draft_tokens=24))
    lm_head = roofline.target.model.lm_head_params
    assert counted - flops == pytest.approx(2.0 * lm_head * 24)
    engine.shutdown()
