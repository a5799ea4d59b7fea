"""Speculative decoding through the real engine (tiny checkpoints, the torch backend): greedy
output ids equal the non-speculative run's exactly, for every k and across the engine's modes —
chunked prefill, prefix hits, preemption (recompute and swap), async scheduling, a core process
— with acceptance statistics that match what the outputs show.

The drafts come from `ngram` (lab's) or `replay` (tests/speculative/replay.py: a plug-in from
outside lab's package that replays the reference run with every third position wrong, so runs
of accepted drafts end in rejections at known places)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from lab.core.sampling_params import SamplingParams
from lab.engine.llm import LLM
from lab.metrics import InMemoryLogger
from lab.metrics.console import spec_summary_text
from lab.metrics.prometheus import PrometheusLogger
from lab.metrics.stats import summarize
from lab.speculative.ngram import lookup
from tests.kv import SMALL_KV
from tests.speculative.replay import write_replay_option

PROMPTS = [[5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6, 7], [11, 12, 13, 14] * 4,
           list(range(20, 40))]
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


def generate(llm: LLM, params: SamplingParams = GREEDY, prompts=PROMPTS) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    return generate(LLM("tiny_llama", **SMALL_KV))


@pytest.fixture(scope="module")
def replay_dir(tmp_path_factory, reference):
    sequences = [p + out for p, out in zip(PROMPTS, reference)]
    return tmp_path_factory.mktemp("conf"), sequences


def replay_llm(replay_dir, k: int, **knobs) -> tuple[LLM, InMemoryLogger]:
    path, sequences = replay_dir
    write_replay_option(path / f"k{k}", sequences, k)
    memory = InMemoryLogger()
    return LLM("tiny_llama", **SMALL_KV, stat_loggers=[memory], config_path=[path / f"k{k}"],
               speculative="replay", **knobs), memory


def check_statistics(memory: InMemoryLogger, outputs: list[list[int]]) -> None:
    """Drafts and acceptances per step add up to the requests'; every step a request emits
    in gives it one token plus its accepted drafts (max_tokens caps the drafts, so no emitted
    token is cut)."""
    steps, reqs = memory.steps, memory.requests
    assert sum(s.num_accepted_tokens for s in steps) == sum(r.num_accepted_tokens for r in reqs)
    assert sum(s.num_draft_tokens for s in steps) == sum(r.num_draft_tokens for r in reqs)
    for s in steps:
        assert sum(s.accepted_per_position) == s.num_accepted_tokens
        assert s.num_accepted_tokens <= s.num_draft_tokens
    for r in reqs:
        emitting_steps = len(r.itl) + 1
        assert r.num_output_tokens == emitting_steps + r.num_accepted_tokens
    assert sum(s.num_generated_tokens for s in steps) == sum(map(len, outputs))


def test_lookup_takes_the_longest_suffix_and_its_latest_occurrence():
    context = np.array([5, 1, 2, 3, 9, 9, 1, 2, 3, 7, 1, 2])
    assert lookup(context, 2, 4, 3) == [3, 7, 1]  # "1 2" last seen before 3 7 1
    assert lookup(context, 3, 4, 3) == []
    assert lookup(np.array([4, 4]), 1, 4, 5) == [4]


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_ids_equal_without_speculation(replay_dir, reference, k):
    llm, memory = replay_llm(replay_dir, k)
    outputs = generate(llm)
    assert outputs == reference
    check_statistics(memory, outputs)
    accepted = sum(s.num_accepted_tokens for s in memory.steps)
    assert 0 < accepted < sum(s.num_draft_tokens for s in memory.steps)  # both kinds happened
    assert llm.engine.core.status().num_used_blocks == 0


MODES = {
    "chunked": dict(max_num_batched_tokens=8),
    "recompute": dict(num_gpu_blocks=6),
    "swap": dict(num_gpu_blocks=6, preemption="swap", **{"cache.swap_space_gb": 0.01}),
    "async": dict(async_scheduling=True),
    "async-swap": dict(async_scheduling=True, num_gpu_blocks=6, preemption="swap",
                       **{"cache.swap_space_gb": 0.01}),
    "reserve": dict(num_gpu_blocks=6, preemption="reserve"),
    "priority": dict(num_gpu_blocks=6, scheduler="priority"),
    "fair": dict(num_gpu_blocks=6, scheduler="fair"),
    "sjf": dict(scheduler="sjf"),
}


SLOW_MODES = {"reserve", "priority", "fair", "sjf"}  # the queue policies: in the slow profile


@pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.slow) if m in SLOW_MODES
                                  else m for m in sorted(MODES)])
def test_greedy_ids_equal_in_every_mode(replay_dir, reference, mode):
    llm, memory = replay_llm(replay_dir, 3, **MODES[mode])
    outputs = generate(llm)
    assert outputs == reference
    check_statistics(memory, outputs)
    if mode in ("recompute", "swap", "async-swap"):
        assert sum(s.num_preempted for s in memory.steps) > 0
    assert llm.engine.core.status().num_used_blocks == 0


def test_prefix_hits_with_drafts(replay_dir, reference):
    """A second run of the same prompts hits the blocks the first cached: only accepted tokens
    were cached, so the hits hold the right KV and the outputs stay exact."""
    llm, memory = replay_llm(replay_dir, 3)
    assert generate(llm) == reference
    assert generate(llm) == reference
    assert sum(s.prefix_cache_hits for s in memory.steps) > 0


def test_core_process_client(replay_dir, reference):
    llm, memory = replay_llm(replay_dir, 3, engine_client="mp")
    try:
        outputs = generate(llm)
    finally:
        llm.engine.shutdown()
    assert outputs == reference
    check_statistics(memory, outputs)


def test_ngram_on_another_family():
    plain = generate(LLM("tiny_qwen3", **SMALL_KV))
    memory = InMemoryLogger()
    spec = LLM("tiny_qwen3", **SMALL_KV, speculative="ngram", stat_loggers=[memory],
               **{"speculative.num_speculative_tokens": 3})
    outputs = generate(spec)
    assert outputs == plain
    check_statistics(memory, outputs)


def test_logprobs_are_those_of_the_emitted_tokens(replay_dir, reference):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    plain = LLM("tiny_llama", **SMALL_KV).generate(PROMPTS, params)
    llm, _ = replay_llm(replay_dir, 3)
    spec = llm.generate(PROMPTS, params)
    for a, b in zip(plain, spec):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            assert x.keys() == y.keys()
            for t in x:
                assert x[t].logprob == pytest.approx(y[t].logprob, abs=1e-4)
                assert x[t].rank == y[t].rank


def test_requests_a_processor_acts_on_get_no_drafts(replay_dir, reference):
    """Penalties act on one row per request: such a request decodes one token a step (and still
    gets what the non-speculative engine gives it), the others speculate."""
    penalised = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                               repetition_penalty=1.3)
    plain = LLM("tiny_llama", **SMALL_KV).generate(PROMPTS[:1], penalised)[0].outputs[0].token_ids
    llm, memory = replay_llm(replay_dir, 3)
    outs = llm.generate(PROMPTS, [penalised, GREEDY, GREEDY])
    assert outs[0].outputs[0].token_ids == plain
    assert [o.outputs[0].token_ids for o in outs[1:]] == reference[1:]
    by_id = {r.request_id: r for r in memory.requests}
    assert by_id[outs[0].request_id].num_draft_tokens == 0
    assert by_id[outs[1].request_id].num_draft_tokens > 0


def test_seeded_sampling_is_reproducible(replay_dir):
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_tokens=16, ignore_eos=True)
    llm, memory = replay_llm(replay_dir, 3)
    first = generate(llm, params)
    assert generate(llm, params) == first
    assert sum(s.num_draft_tokens for s in memory.steps) > 0


def test_bad_options_name_the_field():
    with pytest.raises(Exception, match="num_speculative_tokens"):
        LLM("tiny_llama", **SMALL_KV, speculative="ngram", **{"speculative.num_speculative_tokens": 0})
    with pytest.raises(Exception, match="prompt_lookup_min"):
        LLM("tiny_llama", **SMALL_KV, speculative="ngram", **{"speculative.prompt_lookup_min": 5})


def chi_square_two_samples(a: list, b: list, min_count: int = 10) -> tuple[float, float]:
    """(statistic, critical value at p = 1e-4) of a two-sample chi-square test that `a` and `b`
    come from one distribution: categories seen < min_count times in both pooled into one.
    The critical value is Wilson-Hilferty's approximation of chi2.isf(1e-4, df)."""
    ca, cb = Counter(a), Counter(b)
    big = [c for c in ca.keys() | cb.keys() if ca[c] + cb[c] >= min_count]
    rest = (len(a) - sum(ca[c] for c in big), len(b) - sum(cb[c] for c in big))
    cells = [(ca[c], cb[c]) for c in big] + ([rest] if sum(rest) else [])
    na, nb = len(a), len(b)
    stat = 0.0
    for x, y in cells:
        ea, eb = na * (x + y) / (na + nb), nb * (x + y) / (na + nb)
        stat += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
    df = len(cells) - 1
    z = 3.719  # the standard normal's 1 - 1e-4 quantile
    return stat, df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_sampled_tokens_follow_the_target(tmp_path):
    """Temperature 1 with top-p: the tokens a speculative engine emits are distributed as the
    plain engine's, both where the draft (the greedy continuation) is accepted and where it is
    resampled — token 2 overall, and token 3 after the accepted first draft (600 seeded requests
    each; a two-sample chi-square test at p = 1e-4)."""
    prompt, n = [5, 6, 7, 8, 9, 10, 5, 6, 7], 600

    def run(llm: LLM, seed0: int) -> list[tuple[int, ...]]:
        params = [SamplingParams(temperature=1.0, top_p=0.9, seed=seed0 + i, max_tokens=3,
                                 ignore_eos=True) for i in range(n)]
        return [tuple(o.outputs[0].token_ids) for o in llm.generate([prompt] * n, params)]

    plain = LLM("tiny_llama", **SMALL_KV, max_num_seqs=256)
    greedy = plain.generate([prompt], GREEDY)[0].outputs[0].token_ids
    a = run(plain, 0)
    write_replay_option(tmp_path, [prompt + greedy], 2, wrong_every=10**6)
    memory = InMemoryLogger()
    b = run(LLM("tiny_llama", **SMALL_KV, max_num_seqs=256, speculative="replay", config_path=[tmp_path],
                stat_loggers=[memory]), 10**6)
    accepted = sum(s.num_accepted_tokens for s in memory.steps)
    assert 0 < accepted < sum(s.num_draft_tokens for s in memory.steps)
    stat, critical = chi_square_two_samples([t[1] for t in a], [t[1] for t in b])
    assert stat < critical
    after = greedy[1]
    stat, critical = chi_square_two_samples([t[2] for t in a if t[1] == after],
                                            [t[2] for t in b if t[1] == after])
    assert stat < critical


def test_statistics_reach_the_summary_console_and_prometheus(replay_dir):
    prom = PrometheusLogger("m", textfile=None)
    path, sequences = replay_dir
    write_replay_option(path / "k2", sequences, 2)
    memory = InMemoryLogger()
    llm = LLM("tiny_llama", **SMALL_KV, stat_loggers=[memory, prom], config_path=[path / "k2"],
              speculative="replay")
    generate(llm)
    steps = memory.steps
    drafted = sum(s.num_draft_tokens for s in steps)
    accepted = sum(s.num_accepted_tokens for s in steps)
    verifications = sum(s.num_spec_reqs for s in steps)
    summary = summarize(steps, memory.requests, 1.0)
    assert (summary.spec_num_draft_tokens, summary.spec_num_accepted_tokens) == (drafted, accepted)
    assert summary.spec_acceptance_rate == pytest.approx(accepted / drafted)
    assert summary.spec_mean_acceptance_length == pytest.approx(1 + accepted / verifications)
    assert sum(summary.spec_acceptance_per_position) == pytest.approx(accepted / verifications)
    assert "mean acceptance length" in spec_summary_text(summary)
    text = prom.exposition()
    assert f'lab:spec_decode_num_draft_tokens_total{{model_name="m"}} {float(drafted)}' in text
    assert f'lab:spec_decode_num_accepted_tokens_total{{model_name="m"}} {float(accepted)}' in text
    first = sum(s.accepted_per_position[0] for s in steps)
    assert (f'lab:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",position="0"}} '
            f"{float(first)}") in text


@pytest.mark.parametrize(("model", "attention"), [
    ("tiny_llama", "cpu"), ("tiny_gpt_oss", "torch"),  # the C++ decode kernel; a hybrid cache
    pytest.param("tiny_llama", "triton_flash", marks=pytest.mark.slow),  # the interpreter
    pytest.param("tiny_deepseek", "triton_mla", marks=pytest.mark.slow),
])
def test_backends_verify_several_tokens_per_request(tmp_path, model, attention):
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    plain = generate(LLM(model, **SMALL_KV, attention=attention), params, PROMPTS[:2])
    write_replay_option(tmp_path, [p + out for p, out in zip(PROMPTS, plain)], 3)
    llm = LLM(model, **SMALL_KV, attention=attention, speculative="replay", config_path=[tmp_path])
    assert generate(llm, params, PROMPTS[:2]) == plain


def test_drafts_stop_at_the_context_limit(replay_dir, reference):
    """Requests that run into max_model_len end there as without drafts (drafts are capped so
    the verified positions stay inside the context)."""
    llm, memory = replay_llm(replay_dir, 5, max_model_len=32)
    outputs = generate(llm)
    assert outputs == [ref[: 32 - len(p)] for p, ref in zip(PROMPTS, reference)]
    assert {r.finish_reason for r in memory.requests} == {"length"}
    check_statistics(memory, outputs)


def test_lookup_equals_a_window_search():
    """lookup's candidate rounds find what comparing every window for each n finds."""
    def by_windows(context, n_min, n_max, k):
        for n in range(min(n_max, len(context) - 1), n_min - 1, -1):
            suffix = context[len(context) - n:].tolist()
            for start in range(len(context) - 1 - n, -1, -1):
                if context[start : start + n].tolist() == suffix:
                    return context[start + n : start + n + k].tolist()
        return []

    rng = np.random.default_rng(0)
    for _ in range(300):
        context = rng.integers(0, 6, rng.integers(1, 40))
        n_min = int(rng.integers(1, 4))
        n_max = n_min + int(rng.integers(0, 3))
        assert lookup(context, n_min, n_max, 3) == by_windows(context, n_min, n_max, 3)
