"""The offline API: vLLM-shaped inputs and outputs, knobs through Hydra, bad input refused."""

import pytest

from lab import LLM, SamplingParams
from lab.models.tiny import ensure_tiny_model


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny_llama", num_gpu_blocks=64, max_num_batched_tokens=32, attention="torch")


def test_text_and_token_prompts_in_input_order(llm):
    prompts = ["The quick brown fox", [5, 6, 7], "jumps over", [9] * 20]
    params = [SamplingParams(temperature=0, max_tokens=n) for n in (3, 5, 2, 4)]
    outs = llm.generate(prompts, params)
    assert [len(o.outputs[0].token_ids) for o in outs] == [3, 5, 2, 4]
    assert outs[1].prompt_token_ids == [5, 6, 7]
    assert outs[0].prompt == "The quick brown fox"
    assert outs[0].prompt_token_ids == llm.get_tokenizer().encode("The quick brown fox")
    assert all(o.outputs[0].finish_reason == "length" for o in outs)
    assert isinstance(outs[0].outputs[0].text, str)


def test_single_prompt_and_default_params(llm):
    (out,) = llm.generate([1, 2, 3])
    assert len(out.outputs[0].token_ids) == 16  # vLLM's default max_tokens


def test_seeded_sampling_is_reproducible_across_batches(llm):
    sp = SamplingParams(temperature=1.0, seed=42, max_tokens=8)
    alone = llm.generate([[4, 5, 6]], sp)[0].outputs[0].token_ids
    other = SamplingParams(temperature=0.9, max_tokens=8)
    mixed = llm.generate([[7, 8], [4, 5, 6], [9, 9, 9, 9]], [other, sp, other])
    assert mixed[1].outputs[0].token_ids == alone


def test_knobs_reach_the_engine():
    llm = LLM("tiny_qwen2", num_gpu_blocks=40, block_size=8, enable_prefix_caching=False,
              max_num_seqs=3)
    assert llm.engine.num_blocks == 40
    assert llm.engine.scheduler.kv.block_size == 8
    assert llm.engine.scheduler.config.max_num_seqs == 3
    assert not llm.engine.scheduler.kv.enable_caching


def test_model_directory_uses_hf_option():
    llm = LLM(str(ensure_tiny_model("tiny_qwen3")), num_gpu_blocks=32)
    assert llm.cfg.model._target_.endswith("HFModelSource")
    assert len(llm.generate([[3, 4]], SamplingParams(max_tokens=2))[0].outputs[0].token_ids) == 2


def test_too_long_prompt_rejected_while_others_complete(llm):
    engine = llm.engine
    good = [engine.add_request([3, 4, 5], SamplingParams(max_tokens=4)) for _ in range(2)]
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request([3] * (engine.max_model_len + 5), SamplingParams(max_tokens=4))
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert set(finished) == set(good)
    with pytest.raises(ValueError, match=r"prompts\[1\].*max_model_len"):
        llm.generate([[3], [3] * 10_000])


def test_abort_frees_blocks(llm):
    engine = llm.engine
    rid = engine.add_request([3] * 40, SamplingParams(max_tokens=50))
    engine.step()
    assert engine.scheduler.kv.num_used_blocks > 0
    (out,) = engine.abort_request([rid])
    assert out.outputs[0].finish_reason == "abort"
    assert engine.scheduler.kv.num_used_blocks == 0


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", -1.0), ("top_p", 0.0), ("top_k", -5), ("min_p", 2.0),
    ("max_tokens", 0), ("seed", 1.5), ("stop_token_ids", [-1]),
])
def test_invalid_sampling_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_bad_model_and_knob_names():
    with pytest.raises(ValueError, match="tiny_llama"):
        LLM("no_such_model")
    with pytest.raises(ValueError, match="num_gpu_blocks"):
        LLM("tiny_llama", num_gpu_blockz=4)


@pytest.mark.parametrize("priority", [1.5, "high", None, True])
def test_bad_priority_is_refused_and_others_run(llm, priority):
    engine = llm.engine
    with pytest.raises(ValueError, match="priority"):
        engine.add_request([3, 4], SamplingParams(max_tokens=2), priority=priority)
    with pytest.raises(ValueError, match="priority"):
        llm.generate([[3, 4]], SamplingParams(max_tokens=2), priority=[priority])
    assert len(llm.generate([[3, 4]], SamplingParams(max_tokens=2))[0].outputs[0].token_ids) == 2
