"""A parameter whose logits processor the engine does not list is refused where the request
enters (lab.frontend.processor), naming the parameter, the processor and how to list it; the
default list accepts every parameter. The parameter -> processor map is each processor class's
`implements`."""

from __future__ import annotations

import pytest

from lab import LLM, SamplingParams
from lab.core.model_info import ModelInfo
from lab.frontend.processor import Processor, group_implementers
from lab.logits_processors import BUILTINS
from tests.options import build, target

INFO = ModelInfo(hf_config=None, vocab_size=100, eos_token_id=0, bytes_per_block=0,
                 weight_bytes=0, tokenizer_path=None)
# one request per built-in processor's parameters: (params, the option implementing them)
ASKS = [
    (dict(min_tokens=3), "min_tokens"),
    (dict(logit_bias={5: 1.0}), "logit_bias"),
    (dict(allowed_token_ids=[1, 2]), "allowed_token_ids"),
    (dict(bad_words_token_ids=[[4, 5]]), "bad_words"),
    (dict(presence_penalty=0.5), "penalties"),
    (dict(frequency_penalty=-0.5), "penalties"),
    (dict(repetition_penalty=1.2), "penalties"),
]


def _processor(names: list[str]) -> Processor:
    return Processor(None, INFO, max_model_len=64, max_logprobs=20,
                     logits_processors=[build("logits_processors", n) for n in names])


@pytest.mark.parametrize(("asks", "option"), ASKS)
def test_a_parameter_of_an_unlisted_processor_is_refused(asks, option):
    others = [n for n in BUILTINS if n != option]
    (name, value), = asks.items()
    with pytest.raises(ValueError) as e:
        _processor(others).process([1, 2, 3], SamplingParams(**asks))
    message = str(e.value)
    assert message.startswith(f"{name}=")
    assert f"needs the logits processor {option!r} ({target('logits_processors', option)})" \
        in message
    assert f"logits_processors=[...,{option}]" in message
    assert message.endswith(f"(SamplingParams.{name})")


@pytest.mark.parametrize(("asks", "option"), ASKS)
def test_the_default_list_accepts_every_parameter(asks, option):
    processed = _processor(list(BUILTINS)).process([1, 2, 3], SamplingParams(**asks))
    assert processed.prompt_token_ids == [1, 2, 3]


def test_defaults_and_empty_values_ask_nothing_of_an_engine_without_processors():
    processor = _processor([])
    for params in (SamplingParams(), SamplingParams(logit_bias={}, min_tokens=0,
                                                    repetition_penalty=1.0, bad_words=[])):
        processor.process([1, 2, 3], params)
    with pytest.raises(ValueError, match=r"it runs: none\)"):
        processor.process([1, 2, 3], SamplingParams(min_tokens=1))


def test_the_map_comes_from_the_processor_classes():
    owners = {name: option for name, (option, _) in group_implementers().items()}
    assert owners == {"allowed_token_ids": "allowed_token_ids", "bad_words": "bad_words",
                      "bad_words_token_ids": "bad_words", "min_tokens": "min_tokens",
                      "logit_bias": "logit_bias", "repetition_penalty": "penalties",
                      "frequency_penalty": "penalties", "presence_penalty": "penalties"}


def test_an_engine_listing_only_penalties_refuses_min_tokens():
    llm = LLM("tiny_llama", logits_processors=["penalties"], attention="torch",
              num_gpu_blocks=16, block_size=4)
    sp = SamplingParams(temperature=0, max_tokens=4, min_tokens=3, presence_penalty=0.5)
    with pytest.raises(ValueError, match=r"min_tokens=3 needs the logits processor 'min_tokens'"
                                         r".*it runs: PenaltiesLogitsProcessor"):
        llm.generate([[1, 2, 3]], sp)
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4,
                                                   presence_penalty=0.5))
    assert len(out[0].outputs[0].token_ids) == 4
