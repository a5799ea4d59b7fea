"""OutputProcessor against vLLM 0.32's output rules, driven with hand-made EngineCoreOutputs on
the tiny_llama tokenizer (byte-level BPE: an emoji is four tokens that decode alone to U+FFFD).

Logprob dicts: built as vLLM's dict comprehension builds them (an own token that is also in the
top-k keeps its first place and takes the top-k entry's rank); decoded tokens corrected with the
request's preceding sampled / prompt tokens. Text: no trailing U+FFFD; a stop token's text only
with include_stop_str_in_output; tokens (and their logprobs) past a stop string dropped.
"""

from __future__ import annotations

import pytest

from lab.core.logprobs import LogprobsLists
from lab.core.protocol import EngineCoreOutput
from lab.core.sampling_params import RequestOutputKind, SamplingParams
from lab.frontend.output_processor import OutputProcessor


@pytest.fixture(scope="module")
def tok():
    from lab.frontend.tokenizer import load_tokenizer
    from lab.models.tiny import ensure_tiny_model

    return load_tokenizer(ensure_tiny_model("tiny_llama"))


def lists(own: list[int], k: int = 0, top: list[list[int]] | None = None,
          ranks: list[int] | None = None) -> LogprobsLists:
    """Logprobs of positions whose own tokens are `own`: top-k `top` (default: the own token
    and k - 1 others), logprob -1 - 0.1 * index, own rank 1 unless given."""
    top = top if top is not None else [[t, *range(100, 100 + k - 1)][:k] for t in own]
    rows = [[t, *alts] for t, alts in zip(own, top, strict=True)]
    return LogprobsLists(token_ids=rows,
                         logprobs=[[-1.0 - 0.1 * j for j in range(len(r))] for r in rows],
                         ranks=ranks if ranks is not None else [1] * len(own))


def run(tok, params: SamplingParams, steps: list[EngineCoreOutput], prompt=(5, 6)):
    """Feed the steps for one request "r"; the RequestOutputs it produced."""
    proc = OutputProcessor(tok)
    proc.add_request("r", None, list(prompt), params)
    outs = []
    for step in steps:
        outs.extend(proc.process_outputs([step]).request_outputs)
    return outs


def decoded(rows) -> list[list[str | None]]:
    return [None if r is None else [lp.decoded_token for lp in r.values()] for r in rows]


# ---------------------------------------------------------------- logprob dicts


def test_own_token_in_top_k_keeps_first_place_takes_later_rank(tok):
    """vLLM: {tok: Logprob for (own, top-1..top-k)} - a repeated key stays where it was first
    inserted (first) but holds the last value: the top-k entry's rank and logprob."""
    params = SamplingParams(max_tokens=5, logprobs=3)
    a, b, c = 40, 41, 42
    step = EngineCoreOutput("r", [a], new_logprobs=LogprobsLists(
        token_ids=[[a, b, a, c]], logprobs=[[-0.7, -0.5, -0.69, -2.0]], ranks=[3]))
    (out,) = run(tok, params, [step])
    (row,) = out.outputs[0].logprobs
    assert list(row) == [a, b, c]
    assert (row[a].rank, row[a].logprob) == (2, -0.69)
    assert (row[b].rank, row[c].rank) == (1, 3)
    assert out.outputs[0].cumulative_logprob == -0.7  # the own entry's logprob


def test_sample_logprob_tokens_complete_characters_across_steps(tok):
    """One token per step: an emoji's first three bytes read "" (the character is unfinished),
    the fourth reads as the emoji (its context: the previous positions' own tokens)."""
    ids = tok.encode("a😀!")
    params = SamplingParams(max_tokens=10, logprobs=1, output_kind=RequestOutputKind.DELTA)
    steps = [EngineCoreOutput("r", [t], new_logprobs=lists([t], k=1)) for t in ids]
    steps[-1].finish_reason = "length"
    outs = run(tok, params, steps)
    got = [lp.decoded_token for o in outs for row in o.outputs[0].logprobs for lp in row.values()]
    assert got == ["a", "", "", "", "😀", "!"]
    assert "".join(o.outputs[0].text for o in outs) == "a😀!"


def test_alternatives_decode_with_the_sampled_context(tok):
    """Top-k alternatives at a position are corrected with the same context (the sampled
    tokens before it), not with each other."""
    emoji, other = tok.encode("😀"), tok.encode("😃")
    params = SamplingParams(max_tokens=10, logprobs=2)
    steps = [EngineCoreOutput("r", emoji[:3], new_logprobs=lists(emoji[:3], k=2)),
             EngineCoreOutput("r", [emoji[3]], finish_reason="length", new_logprobs=lists(
                 [emoji[3]], top=[[other[3], emoji[0]]], ranks=[2]))]
    out = run(tok, params, steps)[-1]
    assert decoded(out.outputs[0].logprobs)[-1] == ["😀", "😃", ""]


def test_prompt_logprob_tokens_use_previous_prompt_positions(tok):
    """Prompt logprobs: the first prompt token has none (None) and is no context; later
    positions are corrected with the previous positions' own tokens, across prefill chunks."""
    prompt = tok.encode("漢x😀")
    params = SamplingParams(max_tokens=2, prompt_logprobs=0)
    rows = prompt[1:]
    steps = [EngineCoreOutput("r", [], new_prompt_logprobs=lists(rows[:4])),
             EngineCoreOutput("r", [7], new_prompt_logprobs=lists(rows[4:])),
             EngineCoreOutput("r", [8], finish_reason="length")]
    out = run(tok, params, steps, prompt=prompt)[-1]
    # "漢"'s 2nd and 3rd bytes: the 1st is not context, so they never complete
    assert decoded(out.prompt_logprobs) == [None, [""], [""], ["x"], [""], [""], [""], ["😀"]]


def test_no_tokenizer_no_decoded_tokens(tok):
    """detokenize=False: logprob entries have decoded_token None, the text is ""."""
    params = SamplingParams(max_tokens=3, logprobs=1, detokenize=False)
    ids = tok.encode("😀")
    (out,) = run(tok, params, [EngineCoreOutput("r", ids, finish_reason="length",
                                                new_logprobs=lists(ids, k=1))])
    assert decoded(out.outputs[0].logprobs) == [[None]] * 4 and out.outputs[0].text == ""


# ---------------------------------------------------------------- text


def test_finished_mid_character_has_no_trailing_replacement(tok):
    """A request that ends (max_tokens) inside an emoji: its text stops before it."""
    ids = tok.encode("ok 😀")[:-2]
    params = SamplingParams(max_tokens=len(ids))
    outs = run(tok, params, [EngineCoreOutput("r", ids[:2]),
                             EngineCoreOutput("r", ids[2:], finish_reason="length")])
    assert outs[-1].outputs[0].text == "ok "
    assert outs[-1].outputs[0].token_ids == ids


@pytest.mark.parametrize("include", [False, True])
def test_stop_token_text(tok, include):
    """EOS / a stop_token_ids token that finished the request (finish_reason "stop", the token
    as stop_reason): its text only with include_stop_str_in_output; the token id stays."""
    ids = tok.encode("yes.")
    dot = ids[-1]
    for stop_id, params in [
            (tok.eos_token_id, SamplingParams(max_tokens=9, include_stop_str_in_output=include,
                                              skip_special_tokens=False)),
            (dot, SamplingParams(max_tokens=9, stop_token_ids=[dot],
                                 include_stop_str_in_output=include))]:
        body = ids[:-1] if stop_id == dot else ids
        outs = run(tok, params, [EngineCoreOutput("r", body[:1]), EngineCoreOutput(
            "r", [*body[1:], stop_id], finish_reason="stop", stop_reason=stop_id)])
        completion = outs[-1].outputs[0]
        assert completion.text == tok.decode([*body, stop_id][:len(body) + include],
                                              skip_special_tokens=False)
        assert completion.token_ids == [*body, stop_id]
        assert (completion.finish_reason, completion.stop_reason) == ("stop", stop_id)


def test_stop_string_drops_later_tokens_and_their_logprobs(tok):
    """Several tokens in one step, a stop string completed by an early one: the later tokens
    go, with their logprobs, and cumulative_logprob counts only the kept ones (vLLM trims the
    step before adding its logprobs)."""
    ids = tok.encode("one two three four")
    params = SamplingParams(max_tokens=20, logprobs=0, stop=["two"])
    (out,) = run(tok, params, [EngineCoreOutput("r", ids, new_logprobs=lists(ids))])
    completion = out.outputs[0]
    kept = completion.token_ids
    assert completion.text == "one " and completion.stop_reason == "two"
    assert len(kept) < len(ids) and kept == ids[:len(kept)]
    assert [next(iter(row)) for row in completion.logprobs] == kept
    assert completion.cumulative_logprob == pytest.approx(-1.0 * len(kept))
