"""The engine-core messages survive MessagePack: every field of a request (all SamplingParams
fields) and of a step's outputs (logprobs, prompt logprobs, request and step statistics) decodes
back equal, with the right types; a malformed message is refused, naming what is wrong."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lab.core.logprobs import LogprobsLists
from lab.core.protocol import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from lab.core.sampling_params import RequestOutputKind, SamplingParams
from lab.core.stats import RequestStats, StepStats
from lab.engine.serial import MessageCodec

codec = MessageCodec()

params = st.builds(
    SamplingParams,
    n=st.integers(1, 4),
    temperature=st.floats(0.05, 2.0),
    top_p=st.floats(0.01, 1.0),
    top_k=st.integers(-1, 50),
    seed=st.one_of(st.none(), st.integers(-(2**63), 2**64 - 1)),
    presence_penalty=st.floats(-2, 2),
    repetition_penalty=st.floats(0.1, 3),
    stop=st.lists(st.text(min_size=1, max_size=4), max_size=3),
    stop_token_ids=st.lists(st.integers(0, 1000), max_size=3),
    max_tokens=st.one_of(st.none(), st.integers(16, 64)),
    logprobs=st.one_of(st.none(), st.integers(-1, 20)),
    logit_bias=st.one_of(st.none(), st.dictionaries(st.integers(0, 1000), st.floats(-100, 100),
                                                    max_size=3)),
    allowed_token_ids=st.one_of(st.none(), st.lists(st.integers(0, 1000), min_size=1, max_size=3)),
    bad_words_token_ids=st.one_of(st.none(), st.lists(
        st.lists(st.integers(0, 1000), min_size=1, max_size=3), min_size=1, max_size=2)),
    output_kind=st.sampled_from(list(RequestOutputKind)),
    truncate_prompt_tokens=st.one_of(st.none(), st.integers(1, 8)),
)


@given(params, st.lists(st.integers(0, 2**31), min_size=1, max_size=8))
def test_a_request_with_any_sampling_params_round_trips(sp, prompt):
    req = EngineCoreRequest("r-1", prompt, sp, 1, 12.5, priority=-3, client_id="c")
    back = codec.decode(codec.encode(req), EngineCoreRequest)
    assert back == req
    assert isinstance(back.sampling_params, SamplingParams)
    assert isinstance(back.sampling_params.output_kind, RequestOutputKind)
    assert back.sampling_params.logit_bias == sp.logit_bias  # int keys stay ints


def test_a_steps_outputs_round_trip():
    lists = LogprobsLists([[5, 5, 9]], [[-0.25, -0.25, -1.5]], [1])
    outs = EngineCoreOutputs([
        EngineCoreOutput("a", [5], new_logprobs=lists, num_cached_tokens=16),
        EngineCoreOutput("b", [], new_prompt_logprobs=LogprobsLists([[3], [4]], [[-1.0], [-2.0]],
                                                                    [7, 2])),
        EngineCoreOutput("c", [1], finish_reason="stop", stop_reason="\n",
                         stats=RequestStats("c", 0.5, finish_reason="stop", itl=[0.1, 0.2])),
        EngineCoreOutput("d", [], finish_reason="abort"),
    ], StepStats(step=7, num_running_reqs=3, preempted_by_strategy={"swap": 1}))
    back = codec.decode(codec.encode(outs), EngineCoreOutputs)
    assert back == outs
    assert back.outputs[2].stop_reason == "\n" and back.outputs[0].finished is False


def test_a_malformed_message_is_refused_naming_what_is_wrong():
    good = EngineCoreRequest("r", [1, 2], SamplingParams(), None, 0.0)
    raw = msgspec.msgpack.decode(codec.encode(good))
    raw["sampling_params"]["temperature"] = 9.0  # decodes, then SamplingParams refuses it
    with pytest.raises(ValueError, match="temperature"):
        codec.decode(msgspec.msgpack.encode(raw), EngineCoreRequest)
    raw["sampling_params"]["temperature"] = "hot"
    with pytest.raises(msgspec.ValidationError, match="temperature"):
        codec.decode(msgspec.msgpack.encode(raw), EngineCoreRequest)
    with pytest.raises(TypeError, match="not a message type"):
        codec.decode(b"\x90", SamplingParams)
