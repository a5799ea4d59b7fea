"""The built-in logits processors against their per-request references (lab.logits_processors
.reference), driven the way the model runner drives them: a PersistentBatch whose requests come
and go between steps, update_state(take_update()), apply, then on_sampled with the step's
tokens (-1: the row appended none)."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lab.config.plugins import LAB_CONF
from lab.core.sampling_params import SamplingParams
from lab.logits_processors import BUILTINS
from lab.logits_processors.base import LogitsProcessorContext
from lab.logits_processors.reference import apply_reference
from lab.worker.persistent_batch import PersistentBatch
from tests.options import build

V, MAX_REQS, EOS = 32, 6, (1, 2)
SMALL = st.integers(0, 3)  # tokens the words, prompts and samples mostly share, so they match
TOKEN = st.one_of(SMALL, st.integers(0, V - 1))
CTX = LogitsProcessorContext(vocab_size=V, max_num_reqs=MAX_REQS, eos_token_ids=EOS)


def make(name: str, context: LogitsProcessorContext = CTX):
    """A processor as the runner builds it: the lab/conf/logits_processors partial + the context."""
    return build("logits_processors", name)(context=context)


def knobs(name: str) -> st.SearchStrategy[dict]:
    """SamplingParams fields that make a request use processor `name`."""
    return {
        "allowed_token_ids": st.fixed_dictionaries(
            {"allowed_token_ids": st.lists(TOKEN, min_size=1, max_size=6)}),
        "bad_words": st.fixed_dictionaries({"bad_words_token_ids": st.lists(
            st.lists(SMALL, min_size=1, max_size=4), min_size=1, max_size=4)}),
        "min_tokens": st.fixed_dictionaries(
            {"min_tokens": st.integers(1, 6), "stop_token_ids": st.lists(SMALL, max_size=3),
             "ignore_eos": st.booleans()}),
        "logit_bias": st.fixed_dictionaries({"logit_bias": st.dictionaries(
            TOKEN, st.floats(-5, 5, width=32), min_size=1, max_size=5)}),
        "penalties": st.fixed_dictionaries({
            "repetition_penalty": st.sampled_from([1.0, 0.5, 1.3, 2.0]),
            "frequency_penalty": st.sampled_from([0.0, -1.5, 0.25, 2.0]),
            "presence_penalty": st.sampled_from([0.0, -0.5, 1.0])}),
    }[name]


@st.composite
def request_params(draw, names):
    """SamplingParams using each of `names` with probability 1/2."""
    fields = {}
    for name in names:
        if draw(st.booleans()):
            fields.update(draw(knobs(name)))
    return SamplingParams(**fields)


def run_steps(data, names, steps=6, device="cpu"):
    """Drive the processors `names` (in that order) over `steps` steps of a changing batch and
    check every row against the chained references after each apply."""
    context = LogitsProcessorContext(V, MAX_REQS, torch.device(device), EOS)
    procs = [make(name, context) for name in names]
    batch = PersistentBatch(MAX_REQS)
    requests: dict[str, tuple] = {}  # every request ever added: (params, prompt, live output)
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    for _ in range(steps):
        for _ in range(data.draw(st.integers(0, 3), label="removes")):
            live = [r for r in batch.req_ids if r is not None]
            if live:
                batch.remove(data.draw(st.sampled_from(live)))
        for _ in range(data.draw(st.integers(0, 3), label="adds")):
            if batch.num_reqs == MAX_REQS:
                break
            gone = sorted(set(requests) - set(batch.req_ids))
            if gone and data.draw(st.booleans(), label="resume"):
                req_id = data.draw(st.sampled_from(gone))  # back with the tokens it had
            else:
                req_id = f"r{len(requests)}"
                prompt = data.draw(st.one_of(st.none(), st.lists(TOKEN, max_size=6)))
                output = data.draw(st.lists(SMALL, max_size=4))  # as if resumed: has some
                requests[req_id] = (data.draw(request_params(names)), prompt, output)
            batch.add(req_id, *requests[req_id])
        batch.condense()
        if batch.num_reqs > 1 and data.draw(st.booleans(), label="swap"):
            batch.swap(*data.draw(st.lists(st.integers(0, batch.num_reqs - 1), min_size=2,
                                           max_size=2, unique=True)))
        update = batch.take_update()
        for proc in procs:
            proc.update_state(update)
        n = batch.num_reqs
        logits = torch.randn(n, V, generator=gen) * 3
        logits[logits.abs() < 0.5] = 0.0  # a logit of exactly 0 is not > 0 (multiplied)
        out = logits.to(device, copy=True)
        for proc in procs:
            out = proc.apply(out)
        out = out.cpu()
        expected = [apply_reference(names, logits[i], *requests[r], EOS)
                    for i, r in enumerate(batch.req_ids)]
        assert torch.equal(out, torch.stack(expected) if n else out), (names, batch.req_ids)
        sampled = data.draw(st.lists(st.one_of(st.just(-1), SMALL, TOKEN), min_size=n,
                                     max_size=n), label="sampled")
        for req_id, token in zip(batch.req_ids, sampled):
            if token >= 0:
                requests[req_id][2].append(token)
        for proc in procs:
            proc.on_sampled(torch.tensor(sampled, dtype=torch.long, device=device))


@pytest.mark.parametrize("name", BUILTINS)
@given(data=st.data())
def test_processor_matches_reference_over_a_changing_batch(name, data):
    """Each built-in alone, rows with and without its parameter."""
    run_steps(data, [name])


@given(data=st.data())
def test_all_builtins_chained_match_the_references(data):
    """All five in BUILTINS order (vLLM's), against the chained references."""
    run_steps(data, list(BUILTINS))


@pytest.mark.gpu
@given(data=st.data())
def test_all_builtins_chained_on_cuda_match_the_references(data):
    """The same on CUDA (the device ops must be exact too)."""
    run_steps(data, list(BUILTINS), device="cuda")


def test_conf_options_are_the_builtins():
    """lab/conf/logits_processors holds exactly the built-ins, each building its class."""
    own = sorted(p.stem for p in (LAB_CONF / "logits_processors").glob("*.yaml"))
    assert own == sorted(BUILTINS)
    assert all(not make(name).is_argmax_invariant() for name in BUILTINS)


@pytest.mark.parametrize("name", BUILTINS)
def test_apply_is_the_identity_when_no_row_uses_it(name):
    """No state allocated for requests that do not use it, and none applied once the last one
    that did left: the same tensor comes back unchanged."""
    proc, batch = make(name), PersistentBatch(4)
    for k in range(3):
        batch.add(f"plain{k}", SamplingParams(), [3, 4], [5])
    proc.update_state(batch.take_update())
    logits = torch.randn(3, V)
    before = logits.clone()
    assert proc.apply(logits) is logits and torch.equal(logits, before)
    assert not proc.allocated
    user = SamplingParams(**{
        "allowed_token_ids": {"allowed_token_ids": [0]}, "bad_words": {"bad_words_token_ids": [[3]]},
        "min_tokens": {"min_tokens": 3}, "logit_bias": {"logit_bias": {3: 1.0}},
        "penalties": {"presence_penalty": 1.0}}[name])
    batch.add("user", user, [3], [3])
    proc.update_state(batch.take_update())
    assert proc.allocated and not torch.equal(proc.apply(torch.ones(4, V)), torch.ones(4, V))
    batch.remove("user")
    proc.update_state(batch.take_update())
    assert not proc.active
    assert proc.apply(logits) is logits and torch.equal(logits, before)


def one_row(name, params, prompt, output, logits):
    """`name` applied to a single request's row (the first len(logits) of the vocabulary)."""
    proc, batch = make(name), PersistentBatch(1)
    batch.add("r", params, prompt, output)
    proc.update_state(batch.take_update())
    row = torch.zeros(1, V)
    row[0, :len(logits)] = torch.tensor(logits)
    return proc.apply(row)[0, :len(logits)].tolist()


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    """vLLM: a repeated token's logit > 0 is divided by the penalty, one <= 0 multiplied."""
    params = SamplingParams(repetition_penalty=2.0)
    got = one_row("penalties", params, [0, 1], [2], [4.0, -4.0, 1.0, 3.0])
    assert got == [2.0, -8.0, 0.5, 3.0]


def test_repetition_penalty_beyond_float32_acts_as_its_maximum():
    """Any finite penalty > 0 is valid; 1e300 did not fit the float32 row (RuntimeError in the
    step: a server's 500). It now acts as float32's maximum: positive logits go to ~0, negative
    ones to -inf, a 0 stays 0 (an infinite penalty would make it NaN)."""
    params = SamplingParams(repetition_penalty=1e300)
    got = one_row("penalties", params, [0, 1, 2], [], [4.0, -4.0, 0.0, 3.0])
    assert got[0] == pytest.approx(0.0) and got[1] == float("-inf") and got[2:] == [0.0, 3.0]


def test_presence_and_frequency_count_only_the_output():
    """Token 0 is only in the prompt: untouched; token 1 was generated twice."""
    params = SamplingParams(presence_penalty=1.0, frequency_penalty=0.5)
    assert one_row("penalties", params, [0], [1, 1], [0.0, 0.0, 0.0]) == [0.0, -2.0, 0.0]


def test_two_token_bad_word_bans_its_last_token_only_after_its_first():
    """vLLM: [4, 7] bans 7 only right after a 4; a 1-token word always bans."""
    params = SamplingParams(bad_words_token_ids=[[4, 7], [2]])
    inf = float("-inf")
    row = [0.0] * 8
    assert one_row("bad_words", params, [4], [], row) == [0, 0, inf, 0, 0, 0, 0, 0]
    assert one_row("bad_words", params, None, [4], row) == [0, 0, inf, 0, 0, 0, 0, inf]
    assert one_row("bad_words", params, None, [4, 1], row) == [0, 0, inf, 0, 0, 0, 0, 0]


def test_min_tokens_masks_eos_even_with_ignore_eos_until_reached():
    """EOS (1, 2) and the stop token 5 are masked while the output is short."""
    inf = float("-inf")
    params = SamplingParams(min_tokens=2, ignore_eos=True, stop_token_ids=[5])
    assert one_row("min_tokens", params, None, [3], [0.0] * 6) == [0, inf, inf, 0, 0, inf]
    assert one_row("min_tokens", params, None, [3, 3], [0.0] * 6) == [0.0] * 6


def test_follow_rows_applies_a_batch_update_in_order():
    """removed, then added (a freed index reused; None state: no entry), then moves in order
    (UNIDIRECTIONAL leaves the source empty, SWAP trades)."""
    from lab.core.sampling_params import SamplingParams
    from lab.logits_processors.base import (
        AddedRequest,
        BatchUpdate,
        MoveDirectionality,
        MovedRequest,
        follow_rows,
    )

    def added(index, state):
        return AddedRequest(index, SamplingParams(extra_args={"s": state}), None, [])

    rows = {0: "a", 1: "b", 2: "c"}
    follow_rows(rows, None, lambda a: None)
    assert rows == {0: "a", 1: "b", 2: "c"}
    update = BatchUpdate(
        batch_size=3, removed=[1], added=[added(1, "d"), added(3, None)],
        moved=[MovedRequest(2, 3, MoveDirectionality.UNIDIRECTIONAL),
               MovedRequest(0, 1, MoveDirectionality.SWAP)])
    follow_rows(rows, update, lambda a: a.params.extra_args["s"])
    assert rows == {0: "d", 1: "a", 3: "c"}
