"""The request lifecycle end to end (Processor -> core -> OutputProcessor) on tiny_llama:
logprobs and prompt logprobs against the model's own log-softmax, streaming per output_kind,
n > 1 through the prefix cache, stop strings, validation where requests enter, chat."""

from __future__ import annotations

import math

import pytest
import torch

from lab import LLM, SamplingParams
from lab.core.sampling_params import RequestOutputKind

KNOBS = dict(attention="torch", num_gpu_blocks=96, block_size=4, max_model_len=128)
PROMPT = [5, 17, 33, 60, 71, 90, 102, 3, 44, 48, 9]


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny_llama", **KNOBS)


def _model_logprobs(llm, token_ids: list[int]) -> torch.Tensor:
    """log_softmax of the logits at every position of `token_ids`, by a full forward of the
    HF transformers model on the same checkpoint (independent of lab's runner)."""
    from transformers import AutoModelForCausalLM

    path = llm.engine.model_info.tokenizer_path
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def test_logprobs_and_prompt_logprobs_match_the_model(llm):
    sp = SamplingParams(temperature=0, max_tokens=6, logprobs=5, prompt_logprobs=3,
                        ignore_eos=True)
    (out,) = llm.generate([PROMPT], sp)
    comp = out.outputs[0]
    ref = _model_logprobs(llm, PROMPT + comp.token_ids)
    assert len(comp.logprobs) == 6
    total = 0.0
    for i, (tok, entry) in enumerate(zip(comp.token_ids, comp.logprobs)):
        row = ref[len(PROMPT) - 1 + i]
        assert next(iter(entry)) == tok and entry[tok].rank == 1  # greedy: the argmax
        top = torch.topk(row, 5)
        assert set(entry) == set(top.indices.tolist())
        for t, lp in entry.items():
            assert abs(lp.logprob - row[t].item()) < 1e-4
        total += entry[tok].logprob
    assert math.isclose(comp.cumulative_logprob, total, rel_tol=1e-6)
    assert len(out.prompt_logprobs) == len(PROMPT) and out.prompt_logprobs[0] is None
    for pos in range(1, len(PROMPT)):
        entry, row = out.prompt_logprobs[pos], ref[pos - 1]
        assert next(iter(entry)) == PROMPT[pos]
        assert abs(entry[PROMPT[pos]].logprob - row[PROMPT[pos]].item()) < 1e-4
        assert entry[PROMPT[pos]].rank == int((row >= row[PROMPT[pos]]).sum())
        assert len(entry) in (3, 4)


def test_prompt_logprobs_survive_chunked_prefill_and_skip_the_prefix_cache():
    sp = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2, ignore_eos=True)
    whole = LLM("tiny_llama", **KNOBS).generate([PROMPT], sp)[0]
    chunked_llm = LLM("tiny_llama", **{**KNOBS, "max_num_batched_tokens": 4})
    chunked_llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=2))  # cache it
    chunked = chunked_llm.generate([PROMPT], sp)[0]
    assert chunked.num_cached_tokens == 0  # a prompt_logprobs request reads no cached block
    assert len(chunked.prompt_logprobs) == len(PROMPT)
    for a, b in zip(whole.prompt_logprobs[1:], chunked.prompt_logprobs[1:]):
        assert list(a) == list(b)
        assert all(abs(a[t].logprob - b[t].logprob) < 1e-5 for t in a)


def test_streaming_output_kinds(llm):
    engine = llm.engine
    base = dict(temperature=0, max_tokens=12, ignore_eos=True)
    ids = {kind: engine.add_request("Hello world", SamplingParams(**base, output_kind=kind))
           for kind in RequestOutputKind}
    seen = {kind: [] for kind in RequestOutputKind}
    kind_of = {rid: kind for kind, rid in ids.items()}
    while engine.has_unfinished_requests():
        for out in engine.step():
            seen[kind_of[out.request_id]].append(out)
    final = seen[RequestOutputKind.FINAL_ONLY]
    assert len(final) == 1 and final[0].finished
    full = final[0].outputs[0]
    deltas = seen[RequestOutputKind.DELTA]
    assert "".join(o.outputs[0].text for o in deltas) == full.text
    assert sum((o.outputs[0].token_ids for o in deltas), []) == full.token_ids
    cumulative = seen[RequestOutputKind.CUMULATIVE]
    assert len(cumulative) == 12 and cumulative[-1].outputs[0].text == full.text
    assert [len(o.outputs[0].token_ids) for o in cumulative] == list(range(1, 13))
    assert [o.finished for o in cumulative] == [False] * 11 + [True]


def test_n_children_share_the_prompt_through_the_prefix_cache_and_free_every_block(llm):
    engine = llm.engine
    prompt = [7 + (i % 50) for i in range(33)]  # eight full blocks of 4 + 1 token
    sp = SamplingParams(temperature=1.0, n=4, seed=7, max_tokens=5, ignore_eos=True)
    (out,) = llm.generate([prompt], sp)
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert all(len(c.token_ids) == 5 for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1  # seeds seed + i differ
    cached = {r.request_id: r.num_cached_tokens for r in list(engine.recent_requests)[-4:]}
    rid = out.request_id  # children 1..3 find the 8 full prompt blocks child 0 computed
    assert cached == {f"0_{rid}": 0, f"1_{rid}": 32, f"2_{rid}": 32, f"3_{rid}": 32}
    assert engine.scheduler.kv.num_used_blocks == 0
    again = llm.generate([prompt], sp)[0]  # seeded: the same children again
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]


def test_n_streaming_reports_each_child_and_abort_by_parent_id(llm):
    engine = llm.engine
    rid = engine.add_request([3, 4, 5, 6, 7], SamplingParams(n=3, seed=1, max_tokens=30,
                                                             ignore_eos=True))
    outs = engine.step()  # child 0 prefills; its siblings are held back
    assert {o.request_id for o in outs} == {rid} and outs[0].outputs[0].index == 0
    engine.step()
    aborted = engine.abort_request([rid])
    assert {c.index for o in aborted for c in o.outputs} == {0, 1, 2}
    assert all(c.finish_reason == "abort" for o in aborted for c in o.outputs)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.scheduler.kv.num_used_blocks == 0


def test_stop_string_finishes_and_frees(llm):
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    text = llm.generate(["Once upon"], greedy)[0].outputs[0].text
    stop = text[5:8]
    assert len(stop) == 3 and text.find(stop) == 5
    for include in (False, True):
        sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop],
                            include_stop_str_in_output=include)
        comp = llm.generate(["Once upon"], sp)[0].outputs[0]
        assert comp.finish_reason == "stop" and comp.stop_reason == stop
        assert comp.text == (text[:8] if include else text[:5])
        assert len(comp.token_ids) < 24
    assert llm.engine.scheduler.kv.num_used_blocks == 0
    assert llm.engine.recent_requests[-1].finish_reason == "stop"


@pytest.mark.parametrize("params, field", [
    (dict(logprobs=21), "logprobs"),
    (dict(prompt_logprobs=-1), "prompt_logprobs"),
    (dict(logit_bias={10**6: 1.0}), "logit_bias"),
    (dict(allowed_token_ids=[1, 10**6]), "allowed_token_ids"),
    (dict(stop_token_ids=[10**6]), "stop_token_ids"),
    (dict(bad_words_token_ids=[[10**6]]), "bad_words_token_ids"),
    (dict(n=0), "n"),
    (dict(n=2, temperature=0), "n"),
    (dict(temperature=2.5), "temperature"),
    (dict(presence_penalty=3.0), "presence_penalty"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(stop=[""]), "stop"),
    (dict(stop=["x"], detokenize=False), "stop"),
    (dict(truncate_prompt_tokens=0), "truncate_prompt_tokens"),
    (dict(output_kind=7), "output_kind"),
])
def test_bad_sampling_params_are_refused_naming_the_field(llm, params, field):
    engine = llm.engine
    ok = engine.add_request([3, 4, 5], SamplingParams(temperature=0, max_tokens=3))
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        engine.add_request([3, 4, 5], params)
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert list(done) == [ok] and len(done[ok].outputs[0].token_ids) == 3


def test_bad_words_that_do_not_tokenize_are_refused(llm):
    with pytest.raises(ValueError, match="bad_words"):
        llm.generate(["hi"], SamplingParams(bad_words=["   "]))


def test_truncate_prompt_tokens_keeps_the_last_tokens(llm):
    sp = SamplingParams(temperature=0, max_tokens=3, truncate_prompt_tokens=4)
    (out,) = llm.generate([PROMPT], sp)
    assert out.prompt_token_ids == PROMPT[-4:]
    (ref,) = llm.generate([PROMPT[-4:]], SamplingParams(temperature=0, max_tokens=3))
    assert out.outputs[0].token_ids == ref.outputs[0].token_ids


def test_chat_uses_the_template(llm):
    msgs = [{"role": "user", "content": "Hello"}]
    (out,) = llm.chat(msgs, SamplingParams(temperature=0, max_tokens=4))
    tok = llm.get_tokenizer()
    assert out.prompt_token_ids == tok.encode(tok.hf.bos_token + "user: Hello\nassistant:") or \
        tok.hf.decode(out.prompt_token_ids).endswith("user: Hello\nassistant:")
    assert len(out.outputs[0].token_ids) == 4
    with pytest.raises(ValueError, match="role"):
        llm.chat([{"content": "no role"}])
    refusing = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(ValueError, match="chat template refused .*roles must alternate"):
        llm.chat(msgs, chat_template=refusing)


def test_a_users_processor_is_one_class_and_one_config_entry():
    """The example processor bans the greedy run's first token, for seeded requests only."""
    plain = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    first = LLM("tiny_llama", **KNOBS).generate([PROMPT], plain)[0].outputs[0].token_ids[0]
    entry = {"_target_": "tests.sampling.example_processor.BanTokenForSeededRequests",
             "_partial_": True, "token": first}
    llm = LLM("tiny_llama", **KNOBS, **{"logits_processors.ban_token": entry})
    seeded = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, seed=3)
    outs = llm.generate([PROMPT, PROMPT], [plain, seeded])
    assert outs[0].outputs[0].token_ids[0] == first  # unseeded: untouched
    assert first not in outs[1].outputs[0].token_ids  # seeded: banned


def test_aborting_child_0_before_its_prefill_ends_its_held_siblings_too(llm):
    """Siblings wait for child 0's prefill; if child 0 is aborted first (by its own id) they
    can never start, so they end as aborted too instead of being dropped unreported."""
    engine = llm.engine
    rid = engine.add_request([3, 4, 5, 6], SamplingParams(n=3, seed=2, max_tokens=5))
    outs = engine.abort_request([f"0_{rid}"])
    assert outs and outs[-1].finished
    assert sorted(c.index for o in outs for c in o.outputs) == [0, 1, 2]
    assert not engine.output_processor.has_request(rid)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.scheduler.kv.num_used_blocks == 0
