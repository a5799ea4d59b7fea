"""Fuzzing the OpenAI-compatible server's request bodies (hypothesis) on tiny_llama: whatever a
client posts to /v1/completions or /v1/chat/completions, the answer is never a 5xx; a 4xx is a
400 in OpenAI's error format ({"error": {"message", "type", "param", "code"}}) whose `param`
names the top-level field at fault (and the message mentions it), or a 404 naming `model` for a
model the server does not serve; a 200 is well formed (one
choice per n, usage adds up; a stream ends with `data: [DONE]` and carries no error); afterwards
the server still serves, no request is left in the engine and every KV block is free.

The bodies mix valid and invalid values for every field the protocol models accept, unknown
fields and nulls; the raw bodies are malformed JSON, JSON that is no object, bytes that are no
UTF-8, and empty bodies. After the fuzz: the exact bodies that broke the server before their
fixes (found by the fuzz, or by hand at the boundaries it draws), as plain regression tests. The
server (a uvicorn thread) is the `server` fixture of conftest.py; one module-scoped server and
client serve every example. `--hypothesis-show-statistics` shows the mix of 200s and of the
fields refused."""

import json
import math
import re

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.serve.uvicorn_thread import wait_idle

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
REQUIRED = {COMPLETIONS: "prompt", CHAT: "messages"}
VOCAB = 512  # tiny_llama's (checked against the engine below)
MAX_MODEL_LEN = 128  # conftest.KW
JSON = {"content-type": "application/json"}
MAX_EXAMPLES = max(150, settings().max_examples)  # the `deep` profile runs more


class Field:
    """A field's values: `valid` ones (what the engine accepts, extremes included) and `wild`
    ones (out of range, wrong types, nulls, edge cases the server must refuse or survive)."""

    def __init__(self, valid: st.SearchStrategy, wild: st.SearchStrategy) -> None:
        self.valid, self.wild = valid, wild


ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=6)
NOT_A_NUMBER = st.sampled_from(["3", "many", "", [], {}, [1], True, None])
BAD_FLOATS = st.sampled_from([math.nan, math.inf, -math.inf])
HUGE_INTS = st.sampled_from([2**31, 2**63, 2**64, 10**30, -(2**63) - 1, -(10**30)])
TINY = 5e-324  # the smallest float above 0
TEXT = st.text(st.characters(codec="ascii", categories=["L", "N", "Zs", "P"]), max_size=30) \
    | st.text(max_size=10)
SURROGATES = st.text(st.characters(categories=["Cs", "Ll"]), min_size=1, max_size=4).filter(
    lambda s: any(0xD800 <= ord(c) <= 0xDFFF for c in s))  # JSON's "\ud800" escapes: no text
LONG_TEXT = st.integers(60, 300).map(lambda k: "word " * k)  # beyond max_model_len

PROMPT = Field(
    st.one_of(TEXT.filter(lambda s: s.strip()), st.lists(st.integers(0, VOCAB - 1), min_size=1,
                                                         max_size=12),
              TEXT.filter(lambda s: s.strip()).map(lambda s: [s])),
    st.one_of(SURROGATES, SURROGATES.map(lambda s: [s]), st.just(""), st.just([]), st.just([""]),
              LONG_TEXT,
              st.lists(st.integers(0, VOCAB - 1), min_size=MAX_MODEL_LEN - 1,
                       max_size=MAX_MODEL_LEN + 40),
              st.lists(st.integers(VOCAB, 10**6) | st.integers(-(10**6), -1) | HUGE_INTS,
                       min_size=1, max_size=3).map(lambda bad: [5, *bad]),
              st.lists(TEXT, min_size=2, max_size=3), st.just([[1, 2], [3]]),
              st.just([1, "a"]), st.just([1.5]), st.just([True, False]), NOT_A_NUMBER,
              st.integers(), st.just({"text": "hi"})))
ROLES = ["system", "user", "assistant", "tool", "developer"]
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": TEXT},
                                optional={"name": TEXT})
WILD_MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["wizard", "", "USER", None, 1, ["user"]]),
                           "content": TEXT}),
    st.fixed_dictionaries({"role": st.sampled_from(ROLES),
                           "content": st.sampled_from([None, 5, [{"type": "text",
                                                                  "text": "hi"}]])}),
    st.fixed_dictionaries({"role": st.sampled_from(ROLES)}),  # no content
    st.fixed_dictionaries({"content": TEXT}),  # no role
    st.fixed_dictionaries({"role": st.just("user"), "content": SURROGATES}),
    st.fixed_dictionaries({"role": st.just("user"), "content": TEXT,
                           "name": st.integers() | SURROGATES}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": TEXT,
                           "tool_calls": ANY_JSON}),
    st.sampled_from(["hi", 1, None, []]))
MESSAGES = Field(
    st.lists(MESSAGE, min_size=1, max_size=3),
    st.one_of(st.lists(MESSAGE, max_size=2).flatmap(
                  lambda ok: WILD_MESSAGE.map(lambda bad: [*ok, bad])),
              st.just([]), st.just({}), st.just("hello"), st.integers(), NOT_A_NUMBER,
              LONG_TEXT.map(lambda t: [{"role": "user", "content": t}])))

MAX_TOKENS = Field(st.integers(1, 4),
                   st.one_of(st.integers(-5, 0), HUGE_INTS, st.integers(100, 300),
                             st.sampled_from([2.0, 2.5, -1.0, "3"]), BAD_FLOATS, NOT_A_NUMBER))
PENALTY = Field(st.floats(-2, 2) | st.none(),
                st.floats(2.0001, 1e6) | st.floats(-1e308, -2.0001) | BAD_FLOATS | NOT_A_NUMBER)
BOOL = Field(st.booleans(), st.sampled_from(["yes", "true", "maybe", 1, 2, 0.5, None, [], {}]))
LOGPROBS_K = Field(st.integers(0, 5) | st.none(),
                   st.sampled_from([-1, -2, 20, 21, 10**6, 1.5, "x", True]) | HUGE_INTS)
SHARED = {
    "model": Field(st.sampled_from(["tiny_llama", ""]) | st.none(),  # else a 404
                   st.sampled_from(["gpt-4o", "TINY_LLAMA"]) | TEXT | st.integers() | st.just([])),
    "max_tokens": MAX_TOKENS,
    "temperature": Field(st.sampled_from([0, 0.0, 1e-3, TINY, 2]) | st.floats(0, 2),
                         st.floats(-1e308, -TINY) | st.floats(2.0001, 1e308) | BAD_FLOATS
                         | NOT_A_NUMBER),
    "top_p": Field(st.sampled_from([TINY, 1e-3, 1]) | st.floats(1e-3, 1),
                   st.sampled_from([0, -0.1, 1.5]) | BAD_FLOATS | NOT_A_NUMBER),
    "top_k": Field(st.sampled_from([-1, 0, 1, 5, 40, VOCAB, 10**6, 2**62, 2**63, 10**30]),
                   st.sampled_from([-2, -100, 1.5, -(2**63)]) | NOT_A_NUMBER),
    "min_p": Field(st.floats(0, 1), st.sampled_from([-0.1, 1.1]) | BAD_FLOATS | NOT_A_NUMBER),
    "n": Field(st.integers(1, 3), st.sampled_from([0, -1, 16385, 1.5]) | HUGE_INTS
               | NOT_A_NUMBER),
    "stop": Field(st.one_of(TEXT, st.lists(TEXT.filter(bool), max_size=3), st.none()),
                  st.sampled_from([[""], ["a", ""], [1], 5, {"a": 1}, [["a"]], [None]])),
    "stop_token_ids": Field(st.lists(st.integers(0, VOCAB - 1), max_size=3) | st.none(),
                            st.sampled_from([[-1], [VOCAB], [10**30], "x", [1.5], 3])),
    "seed": Field(st.integers(-(2**63), 2**64 - 1) | st.sampled_from([-1, 0, 2**64 - 1,
                                                                      -(2**63)]) | st.none(),
                  st.sampled_from([2**64, -(2**63) - 1, 10**30, 1.5, "x"])),
    "presence_penalty": PENALTY, "frequency_penalty": PENALTY,
    "repetition_penalty": Field(  # any finite r > 0: extremes first (one_of favours them)
        st.sampled_from([TINY, 1e-30, 1e30, 1e300, 1.7976931348623157e308]) | st.floats(0.05, 2)
        | st.none(), st.sampled_from([0, -1.0]) | BAD_FLOATS | NOT_A_NUMBER),
    "logit_bias": Field(
        st.dictionaries(st.integers(0, VOCAB - 1).map(str), st.floats(-100, 100), max_size=3),
        st.one_of(
            st.dictionaries(st.sampled_from(["abc", "-1", "1e3", "1.5", " 3 ", "", str(VOCAB),
                                             str(10**30), "\u0663", "\ud800"]),
                            st.floats(-100, 100), min_size=1, max_size=2),
            st.dictionaries(st.integers(0, VOCAB - 1).map(str),
                            st.floats(100.0001, 1e308) | st.floats(-1e308, -100.0001)
                            | BAD_FLOATS | NOT_A_NUMBER, min_size=1, max_size=2),
            st.sampled_from([[], "x", 5, [[1, 2]]]))),
    "stream": BOOL,
    "stream_options": Field(
        st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}) | st.none(),
        st.sampled_from([{"include_usage": "x"}, {"other": 1}, 5, "yes", []])),
    "ignore_eos": BOOL,
    "min_tokens": Field(st.integers(0, 3), st.sampled_from([-1, 10**6, 1.5, "x", None])
                        | HUGE_INTS),
    "include_stop_str_in_output": BOOL, "skip_special_tokens": BOOL,
    "user": Field(TEXT | st.none(), st.integers()),
}
ONLY = {
    COMPLETIONS: {"prompt": PROMPT, "logprobs": LOGPROBS_K,
                  "echo": Field(st.just(False), st.just(True)),
                  "suffix": Field(st.none(), TEXT | st.integers())},
    CHAT: {"messages": MESSAGES, "max_completion_tokens": MAX_TOKENS,
           "logprobs": BOOL, "top_logprobs": LOGPROBS_K},
}
UNKNOWN = st.sampled_from(["bogus", "best_of", "functions", "response_format", "tools", "Prompt",
                           "max-tokens", "", "prompt ", "messages_", "echo", "top_logprobs"])


@st.composite
def json_bodies(draw) -> tuple[str, dict]:
    """(path, body): the endpoint's required field and a few others, each wild (out of range,
    wrong type, null...) with probability 1/10, so about half the bodies are valid and most
    others have one fault, which then reaches the layer that must catch it (pydantic, the
    server, SamplingParams, the engine's Processor, the step). max_tokens 1..4 unless drawn."""
    path = draw(st.sampled_from([COMPLETIONS, CHAT]))
    fields = {**SHARED, **ONLY[path]}
    names = draw(st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=8, unique=True))
    # rare choices are the top value of an integer draw, so that the simplest (all-zero)
    # example, and what failures shrink toward, is a valid body
    if draw(st.integers(0, 9)) < 9:  # 10%: the required field is missing
        names.insert(0, REQUIRED[path])
    if not {"max_tokens", "max_completion_tokens"} & set(names) and draw(st.integers(0, 19)) < 19:
        names.append("max_tokens")
    body = {}
    for name in dict.fromkeys(names):
        field = fields[name]
        wild = draw(st.integers(0, 9)) == 9
        body[name] = draw(field.wild if wild else field.valid)
    if draw(st.integers(0, 9)) == 9:  # 10%: an unknown (or misspelt, or other endpoint's) field
        body[draw(UNKNOWN.filter(lambda k: k not in fields))] = draw(ANY_JSON)
    return path, body


VALID_JSON = st.fixed_dictionaries({"prompt": st.just("hi"), "max_tokens": st.just(2)})
RAW = st.one_of(
    st.just(b""), st.just(b" \n"), st.binary(max_size=40),
    st.sampled_from([b"{", b"}", b"{not json", b'{"prompt": "x",}', b"{'prompt': 'x'}", b"nul",
                     b'{"prompt": "x"', b'{"prompt": "x"}}', b'{"prompt": "\\ud8"}', b"\xff\xfe{}",
                     b"[" * 5000 + b"]" * 5000, b'{"max_tokens": 1' + b"0" * 5000 + b"}",
                     b'{"prompt": "x", "prompt": [1, 2], "max_tokens": 1e999}'[:-1]]),
    st.text(max_size=30).map(lambda s: s.encode("utf-16")),
    st.one_of(st.lists(ANY_JSON, max_size=3), st.integers(), st.floats(), st.text(max_size=8),
              st.none(), st.booleans()).map(lambda v: json.dumps(v).encode()),  # not an object
    VALID_JSON.map(lambda b: json.dumps(b).encode()).flatmap(
        lambda raw: st.integers(1, len(raw) - 1).map(lambda k: raw[:k])))  # cut short
CONTENT_TYPES = st.sampled_from([JSON, JSON, JSON, {}, {"content-type": "text/plain"},
                                 {"content-type": "application/json; charset=utf-8"}])


# -- checks ------------------------------------------------------------------------------------
def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_error(r, body=None, path=None) -> dict:
    """A 400 in OpenAI's error format; for a JSON object body, `param` is a top-level field of
    the body (or the endpoint's missing required field) and the message mentions it."""
    assert r.status_code == 400, (r.status_code, r.text, body)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"], err
    assert err["type"] == "BadRequestError" and err["code"] == 400, err
    if isinstance(body, dict):
        param = err["param"]
        assert isinstance(param, str), (err, body)
        assert param in body or param == REQUIRED[path], (err, body)
        assert re.search(rf"(?<![\w-]){re.escape(param)}(?![\w-])", err["message"]), (err, body)
    else:
        assert err["param"] in (None, "body"), err
    return err


def _limit(body: dict, path: str) -> int | None:
    limit = body.get("max_completion_tokens") if path == CHAT else None
    limit = body.get("max_tokens") if limit is None else limit
    return limit if _is_int(limit) else None


def check_usage(usage: dict, n: int, limit: int | None) -> None:
    assert all(_is_int(usage[k]) for k in ("prompt_tokens", "completion_tokens", "total_tokens"))
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], usage
    assert 1 <= usage["prompt_tokens"] < MAX_MODEL_LEN, usage
    assert n <= usage["completion_tokens"], usage  # each choice made at least one token
    if limit is not None:
        assert usage["completion_tokens"] <= n * limit, usage


def check_ok(r, body: dict, path: str) -> None:
    n = int(body.get("n", 1))  # what the model validated ("2", 2.0 -> 2)
    chat, limit = path == CHAT, _limit(body, path)
    if r.headers["content-type"].startswith("text/event-stream"):
        check_stream(r.text, body, n, chat, limit)
        return
    out = r.json()
    assert out["object"] == ("chat.completion" if chat else "text_completion"), out
    assert out["id"].startswith("chatcmpl-" if chat else "cmpl-"), out
    assert sorted(c["index"] for c in out["choices"]) == list(range(n)), out
    for c in out["choices"]:
        assert c["finish_reason"] in ("stop", "length"), c
        if chat:
            assert c["message"]["role"] == "assistant", c
            assert isinstance(c["message"]["content"], str), c
        else:
            assert isinstance(c["text"], str), c
    check_usage(out["usage"], n, limit)


def check_stream(raw: str, body: dict, n: int, chat: bool, limit: int | None) -> None:
    assert raw.endswith("data: [DONE]\n\n"), raw[-200:]
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), events
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert not [c for c in chunks if "error" in c], chunks  # no in-band error: a valid request
    finished = {}
    for c in chunks:
        assert c["object"] == ("chat.completion.chunk" if chat else "text_completion"), c
        for choice in c["choices"]:
            assert 0 <= choice["index"] < n, c
            if choice.get("finish_reason"):
                finished[choice["index"]] = choice["finish_reason"]
    assert sorted(finished) == list(range(n)), chunks
    assert set(finished.values()) <= {"stop", "length"}, finished
    usage = chunks[-1].get("usage") if chunks else None
    if usage is not None:  # stream_options.include_usage: the last chunk, with no choices
        assert chunks[-1]["choices"] == []
        check_usage(usage, n, limit)


def post(client, path: str, body, headers=JSON):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()  # NaN, Infinity too
    return client.post(path, content=raw, headers=headers)


def check_not_found(r, body) -> None:
    """A 404 in OpenAI's format, for a body that names a model the server does not serve."""
    assert isinstance(body, dict) and isinstance(body.get("model"), str), (r.text, body)
    assert body["model"] not in ("", "tiny_llama"), (r.text, body)
    err = r.json()["error"]
    assert err == {"message": f"The model `{body['model']}` does not exist.",
                   "type": "NotFoundError", "param": "model", "code": 404}, err


def check_response(r, path: str, body) -> None:
    assert r.status_code < 500, (r.status_code, r.text, body)
    assert r.status_code in (200, 400, 404), (r.status_code, r.text, body)  # no 422
    if r.status_code == 404:
        check_not_found(r, body)
    elif r.status_code == 400:
        check_error(r, body, path)
    else:
        assert isinstance(body, dict), (r.text, body)
        check_ok(r, body, path)


# -- the fuzz ----------------------------------------------------------------------------------
FUZZ = settings(max_examples=MAX_EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@FUZZ
@given(case=json_bodies())
def test_fuzz_json_bodies(server, client, case):
    path, body = case
    r = post(client, path, body)
    check_response(r, path, body)
    # --hypothesis-show-statistics: the mix of outcomes, and which fields were refused
    event(f"{r.status_code} {r.json()['error']['param'] if r.status_code == 400 else ''}")


@settings(FUZZ, max_examples=MAX_EXAMPLES // 3)
@given(path=st.sampled_from([COMPLETIONS, CHAT]), raw=RAW, headers=CONTENT_TYPES)
def test_fuzz_raw_bodies(server, client, path, raw, headers):
    r = post(client, path, raw, headers)
    assert r.status_code == 400, (r.status_code, r.text, raw)
    check_error(r)


# -- regressions: bodies that broke the server before their fixes --------------------------------
# (path, body, the param of the expected 400, or None for a 200)
REGRESSIONS = [
    # fuzz: a lone surrogate (JSON's "\uddc2" escape) in the prompt: the tokenizer raised
    # TypeError, a 500
    (COMPLETIONS, {"max_tokens": 4, "prompt": ["\uddc2\u2d16\u0234"]}, "prompt"),
    (COMPLETIONS, {"max_tokens": 1, "prompt": "a\ud800"}, "prompt"),
    # fuzz: ... and in a chat message: rendering the chat template raised TypeError, a 500
    (CHAT, {"max_tokens": 2147483648, "messages": [
        {"content": "\udabd", "name": "\u0271\u0111", "role": "system"},
        {"content": "\ua749\u0257\xe4\udfd0", "name": "byv", "role": "assistant"},
        {"content": "\u01d6\U0001d457\u1d23\xe6", "role": "developer"}]}, "messages"),
    # (in a name: tiny_llama's template does not render names; templates that do raised the same)
    (CHAT, {"max_tokens": 1, "messages": [{"role": "user", "content": "hi", "name": "\udfff"}]},
     "messages"),
    # fuzz: top_k >= 2**63 (any k >= 1 is valid) overflowed the step's int64 top_k tensor: the
    # step failed, a 500 (an in-band error chunk when streamed)
    (CHAT, {"ignore_eos": "yes", "messages": [{"content": "", "role": "system"}],
            "top_k": 9223372036854775808}, None),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 2, "top_k": 10**30, "stream": True}, None),
    # fuzz (dev profile) and by hand: a repetition penalty beyond float32 did not fit the
    # penalties row: the step failed, a 500
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 2, "repetition_penalty": 1e300}, None),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "repetition_penalty": 1.7976931348623157e308, "stream": True}, None),
    # fuzz: chat's max_completion_tokens out of range was refused naming max_tokens, a field
    # the body does not have
    (CHAT, {"max_completion_tokens": 0, "messages": [{"content": "", "role": "system"}]},
     "max_completion_tokens"),
    (CHAT, {"max_completion_tokens": 1000, "messages": [{"content": "hi", "role": "user"}]},
     "max_completion_tokens"),
    # by hand: top_logprobs out of [0, max_logprobs] was refused naming logprobs, with the
    # engine's "Requested sample logprobs of 512" for -1
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "logprobs": True,
            "top_logprobs": -1}, "top_logprobs"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "logprobs": True,
            "top_logprobs": 21}, "top_logprobs"),
    # by hand: a lone surrogate in a stop string gave param null and the codec's message
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 1, "stop": ["ok", "\ud800"]}, "stop"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            "stop": "\udfff"}, "stop"),
    # by hand: stream_options without stream=true was accepted (vLLM refuses it)
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 1, "stream_options": {"include_usage": True}},
     "stream_options"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "stream": False,
            "stream_options": {"include_usage": False}}, "stream_options"),
    # by hand: logit_bias beyond OpenAI's [-100, 100] was accepted
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 1, "logit_bias": {"5": 1e308}}, "logit_bias"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 1, "logit_bias": {"5": -100.5}}, "logit_bias"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 1, "logit_bias": {"5": 100, "6": -100}}, None),
    # by hand: booleans and floats were read as token ids (true -> 1, 2.0 -> 2)
    (COMPLETIONS, {"prompt": [True, False], "max_tokens": 1}, "prompt"),
    (COMPLETIONS, {"prompt": [5, 2.0], "max_tokens": 1}, "prompt"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 1, "stop_token_ids": [True]},
     "stop_token_ids"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            "stop_token_ids": [7.0]}, "stop_token_ids"),
]


@pytest.mark.parametrize("path,body,param", REGRESSIONS)
def test_regressions(server, client, path, body, param):
    r = post(client, path, body)
    check_response(r, path, body)
    assert r.status_code == (400 if param else 200), r.text
    if param:
        assert r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("raw", [
    b"\x80",  # fuzz: not UTF-8: FastAPI's own 400, {"detail": ...}, not OpenAI's format
    b"[" * 5000 + b"]" * 5000,  # json.loads' RecursionError: the same
    b'{"max_tokens": 1' + b"0" * 5000 + b"}",  # a 5001-digit integer: the same
])
def test_regressions_raw(server, client, raw):
    err = check_error(post(client, COMPLETIONS, raw))
    assert err["param"] == "body" and err["message"].startswith("malformed JSON body"), err


def test_other_http_errors_are_openai_format(server, client):
    """404 and 405 come in OpenAI's format too (they were FastAPI's {"detail": ...})."""
    r = client.get(COMPLETIONS)
    assert r.status_code == 405 and "POST" in r.headers["allow"]
    assert r.json()["error"] == {"message": "Method Not Allowed", "type": "MethodNotAllowedError",
                                 "param": None, "code": 405}
    r = client.post("/v1/nothing", json={})
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"


# -- last: the server still serves, and the engine holds nothing --------------------------------
def test_still_serving_after_fuzz(server, client):
    """After everything above: a greedy request is a 200, no request is left unfinished, and
    every KV block is free."""
    _, async_llm = server
    assert async_llm.engine.processor.vocab_size == VOCAB
    assert async_llm.max_model_len == MAX_MODEL_LEN
    body = {"prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0,
            "ignore_eos": True}
    r = post(client, COMPLETIONS, body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4
    assert client.get("/health").status_code == 200
    status = wait_idle(async_llm)
    assert async_llm.num_unfinished() == 0
    assert (status.num_requests, status.num_used_blocks) == (0, 0), status
