"""SamplingParams.extra_args and SamplingParams subclasses reach the logits processors,
in-process and across the engine-core process boundary (engine_client=mp)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from lab import LLM, SamplingParams
from lab.core.protocol import EngineCoreRequest
from lab.core.sampling_params import as_sampling_params
from lab.engine.serial import MessageCodec
from tests.sampling.extra_args_processor import BanParams

PROCESSOR = {"_target_": "tests.sampling.extra_args_processor.BanTokenFromArgs",
             "_partial_": True}
KNOBS = dict(attention="torch", num_gpu_blocks=32, block_size=4, max_model_len=64)
PROMPT = [5, 6, 7, 8]


def test_extra_args_is_a_json_like_dict_kept_as_a_deep_copy():
    given = {"k": (1, 2.5, {"nested": [True, None, "s"]})}
    sp = SamplingParams(extra_args=given)
    assert sp.extra_args == {"k": [1, 2.5, {"nested": [True, None, "s"]}]}
    given["k"] = 0
    assert sp.extra_args["k"] != 0
    assert as_sampling_params({"extra_args": {"a": 1}}).extra_args == {"a": 1}
    assert SamplingParams().extra_args is None


@pytest.mark.parametrize("bad", [{1: "x"}, ["a"], {"a": float("nan")}, {"a": object()},
                                 {"a": 2**64}, {"a": {"b": {3: 4}}}, "a=1"])
def test_bad_extra_args_are_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match=r"extra_args must be None or a dict with string keys.*"
                                         r"\(SamplingParams.extra_args\)"):
        SamplingParams(extra_args=bad)


def test_a_request_with_extra_args_or_a_subclass_round_trips():
    codec = MessageCodec()
    for sp in (SamplingParams(temperature=0, extra_args={"a": [1, {"b": "c"}]}),
               BanParams(temperature=0, ban_token_id=3, extra_args={"x": 1.5})):
        req = EngineCoreRequest("r", [1, 2], sp, 0, 1.0)
        back = codec.decode(codec.encode(req), EngineCoreRequest)
        assert back == req and type(back.sampling_params) is type(sp)


def test_a_subclass_that_cannot_be_imported_by_path_is_refused_where_it_is_encoded():
    @dataclass(frozen=True)
    class Local(SamplingParams):
        mine: int = 0

    req = EngineCoreRequest("r", [1, 2], Local(mine=1), 0, 1.0)
    with pytest.raises(ValueError, match=r"Local \(a SamplingParams subclass defined in .* inside "
                                         r"a function\) cannot cross to the engine-core process"):
        MessageCodec().encode(req)


@pytest.fixture(scope="module", params=["inproc", "mp"])
def llm(request):
    llm = LLM("tiny_llama", engine_client=request.param, **KNOBS,
              **{"logits_processors.ban": PROCESSOR})
    yield llm
    llm.engine.shutdown()


def _tokens(llm, params):
    return llm.generate([PROMPT], params)[0].outputs[0].token_ids


def test_a_processor_reads_extra_args_and_subclass_fields_per_request(llm):
    plain = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    first = _tokens(llm, plain)[0]
    by_args = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True,
                             extra_args={"ban_token_id": first})
    by_field = BanParams(temperature=0, max_tokens=4, ignore_eos=True, ban_token_id=first)
    outs = llm.generate([PROMPT] * 3, [plain, by_args, by_field])
    ids = [o.outputs[0].token_ids for o in outs]
    assert ids[0][0] == first  # the same batch: only the requests that ask ban it
    assert first not in ids[1] and first not in ids[2]
    assert ids[1] == ids[2]
