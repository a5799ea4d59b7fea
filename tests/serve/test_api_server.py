"""The OpenAI-compatible server on tiny_llama, served by a real uvicorn in a thread: greedy
outputs equal LLM.generate / LLM.chat, streaming, usage, 400s for bad input (a prompt too long
for the context blamed on itself, a huge one refused untokenized), 404 for another model, chat
content as text parts, aborts on disconnect, the event loop serving while a prompt is
tokenized, /health, /v1/models, /metrics. The fixtures (llm, server, client) are in
conftest.py."""

import asyncio
import json
import threading
from pathlib import Path

import httpx
import pytest

from lab.core.sampling_params import SamplingParams
from tests.serve.conftest import CLIENT_TIMEOUT_S, MAX_N
from tests.serve.uvicorn_thread import wait_idle

PROMPT = "The quick brown fox"
CHAT = [{"role": "user", "content": "Hello there"}]


def _reference(llm, max_tokens=12):
    # inproc: the server steps this LLM's engine from its thread; run the reference first
    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return llm.generate(PROMPT, sp)[0].outputs[0], llm.chat(CHAT, sp)[0].outputs[0]


@pytest.fixture(scope="module")
def reference(llm):
    return _reference(llm)


def test_completion_matches_llm(reference, server, client):
    ref, _ = reference
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 12,
                                             "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["text"] == ref.text
    assert body["choices"][0]["finish_reason"] == "length"
    u = body["usage"]
    assert u["completion_tokens"] == 12 and u["total_tokens"] == u["prompt_tokens"] + 12


def test_chat_matches_llm_via_openai_client(reference, server):
    openai = pytest.importorskip("openai")
    _, ref = reference
    c = openai.OpenAI(base_url=server[0] + "/v1", api_key="x")
    resp = c.chat.completions.create(model="tiny_llama", messages=CHAT, max_tokens=12,
                                     temperature=0, extra_body={"ignore_eos": True})
    assert resp.choices[0].message.content == ref.text
    assert resp.usage.completion_tokens == 12
    chunks = list(c.chat.completions.create(
        model="tiny_llama", messages=CHAT, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == ref.text
    assert chunks[-1].usage.completion_tokens == 12


def test_completions_via_the_async_openai_client(reference, server):
    """The official async client, streaming and not: greedy text equals LLM.generate's, the
    streamed deltas concatenate to it, usage counts right."""
    openai = pytest.importorskip("openai")
    ref, _ = reference

    async def main():
        c = openai.AsyncOpenAI(base_url=server[0] + "/v1", api_key="x")
        kw = dict(model="tiny_llama", prompt=PROMPT, max_tokens=12, temperature=0,
                  extra_body={"ignore_eos": True})
        full = await c.completions.create(**kw)
        stream = await c.completions.create(**kw, stream=True,
                                            stream_options={"include_usage": True})
        chunks = [ch async for ch in stream]
        await c.close()
        return full, chunks

    full, chunks = asyncio.run(main())
    assert full.choices[0].text == ref.text and full.usage.completion_tokens == 12
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == ref.text
    assert chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_completion_stream(reference, server, client):
    ref, _ = reference
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        raw = r.read().decode()
    events = [e[len("data: "):] for e in raw.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    data = [json.loads(e) for e in events[:-1]]
    assert "".join(c["text"] for d in data for c in d["choices"]) == ref.text
    assert data[-1]["usage"]["completion_tokens"] == 12
    assert data[-2]["choices"][0]["finish_reason"] == "length"


def test_token_id_prompt_and_logprobs(llm, server, client):
    ids = llm.get_tokenizer().encode(PROMPT)
    r = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 4, "temperature": 0,
                                             "logprobs": 2, "ignore_eos": True})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == 4 and all(v <= 0 for v in lp["token_logprobs"])
    r = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 3,
                                                  "logprobs": True, "top_logprobs": 2})
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert len(content) <= 3 and all(len(t["top_logprobs"]) == 2 for t in content)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": "many"}, "max_tokens"),
    ("/v1/completions", {"prompt": PROMPT, "bogus": 1}, "bogus"),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 1000}, "max_tokens"),
    ("/v1/completions", {"prompt": PROMPT, "temperature": 5}, "temperature"),
    ("/v1/completions", {"prompt": PROMPT, "top_p": 0}, "top_p"),
    ("/v1/completions", {"max_tokens": 3}, "prompt"),
    ("/v1/completions", {"prompt": [], "max_tokens": 3}, "prompt"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages"),
    ("/v1/chat/completions", {"messages": CHAT, "n": 0}, "n"),
])
def test_bad_requests_are_400(server, client, path, body, param):
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == 400 and err["type"] == "BadRequestError"
    assert err["param"] == param, err
    assert client.get("/health").status_code == 200


def test_malformed_json_is_400_and_server_still_serves(server, client):
    r = client.post("/v1/completions", content=b"{not json",
                    headers={"content-type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
    assert r.status_code == 200


def test_disconnect_aborts_request(server, client):
    _, async_llm = server
    body = {"prompt": PROMPT, "max_tokens": 100, "ignore_eos": True, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    # the response is closed: the server aborts the request and frees its blocks
    status = wait_idle(async_llm)
    assert (status.num_requests, status.num_used_blocks) == (0, 0)
    assert async_llm.num_unfinished() == 0


def test_health_models_version_metrics(server, client):
    assert client.get("/health").status_code == 200
    models = client.get("/v1/models").json()
    assert models["data"][0]["id"] == "tiny_llama"
    # root is the checkpoint directory, as in vLLM (`vllm bench serve` loads its tokenizer there)
    root = models["data"][0]["root"]
    assert root == server[1].model_path and (Path(root) / "config.json").is_file()
    assert "version" in client.get("/version").json()
    text = client.get("/metrics").text
    assert "lab:generation_tokens_total" in text


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "model": "gpt-4o"}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1, "model": "gpt-4o"}),
])
def test_another_model_is_404(server, client, path, body):
    r = client.post(path, json=body)
    assert r.status_code == 404, r.text
    assert r.json()["error"] == {"message": "The model `gpt-4o` does not exist.",
                                 "type": "NotFoundError", "param": "model", "code": 404}
    for model in ("tiny_llama", "", None):  # the served name, or none (vLLM: empty is none)
        ok = {k: v for k, v in body.items() if k != "model"} | {"model": model}
        assert client.post(path, json=ok).status_code == 200


LONG = "word " * 200  # 601 tokens: over max_model_len=128, under the early bound (1000 < 52 * 128)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": list(range(3, 131)), "max_tokens": 10}, "prompt"),
    ("/v1/completions", {"prompt": LONG, "max_tokens": 10}, "prompt"),
    ("/v1/completions", {"prompt": LONG}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}],
                              "max_completion_tokens": 10}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}, "messages"),
    # the prompt fits (127 of 128 tokens), max_tokens does not: max_tokens is at fault
    ("/v1/completions", {"prompt": list(range(3, 130)), "max_tokens": 2}, "max_tokens"),
])
def test_a_prompt_that_fills_the_context_is_blamed_on_itself(server, client, path, body, param):
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    if param != "max_tokens":  # the prompt's length and the limit
        assert "maximum context length is 128 tokens" in err["message"], err
        n = len(body["prompt"]) if isinstance(body.get("prompt"), list) else None
        assert f"has {n} tokens" in err["message"] if n else " tokens," in err["message"], err


HUGE = "word " * 10**6  # 5 MB of text: a lower bound on its token count is over 128 already


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": HUGE, "max_tokens": 1}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": HUGE}],
                              "max_tokens": 1}, "messages"),
])
def test_a_huge_text_prompt_is_refused_before_it_is_tokenized(server, client, monkeypatch, path,
                                                              body, param):
    tok = server[1].tokenizer
    encode, tokenized = tok.encode, []
    monkeypatch.setattr(tok, "encode", lambda text, *a: tokenized.append(len(text))
                        or encode(text, *a))
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and "has at least" in err["message"], err
    assert not [n for n in tokenized if n >= len(HUGE)], tokenized


def test_the_loop_serves_while_a_prompt_is_tokenized(server, client, monkeypatch):
    """Tokenizing runs on AsyncLLM's tokenizer thread, off the event loop: while one is held
    until /health answered, /health answers (with async_mp it was held too: the tokenization
    ran on the loop). Ordering, not timing: the hold ends after 10 s either way."""
    url, async_llm = server
    tok, mark = async_llm.tokenizer, "hold this prompt"
    encode, started, answered, order = tok.encode, threading.Event(), threading.Event(), []

    def held(text, *args):
        if text == mark:
            started.set()
            answered.wait(10)
            order.append("tokenized")
        return encode(text, *args)

    monkeypatch.setattr(tok, "encode", held)
    replies = []
    post = threading.Thread(target=lambda: replies.append(httpx.post(
        url + "/v1/completions", json={"prompt": mark, "max_tokens": 1},
        timeout=CLIENT_TIMEOUT_S)))
    post.start()
    assert started.wait(10)
    assert client.get("/health").status_code == 200
    order.append("health")
    answered.set()
    post.join(30)
    assert order == ["health", "tokenized"]
    assert replies[0].status_code == 200, replies[0].text


def test_logit_bias_with_more_keys_than_the_vocabulary_is_refused_by_its_count(server, client):
    """Refused at once, by the count (there are only 512 token ids), not key by key."""
    bias = {str(i): 1.0 for i in range(513)}
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1,
                                             "logit_bias": bias})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "logit_bias" and "513 entries" in err["message"], err


def test_n_over_the_servers_max_n_is_400(server, client):
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "n": MAX_N + 1})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "n" and f"at most {MAX_N}" in err["message"], err


def _chat(client, *messages, max_tokens=4):
    return client.post("/v1/chat/completions", json={
        "messages": list(messages), "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True})


def test_chat_content_as_text_parts(server, client):
    """OpenAI's content arrays: text parts, joined by newlines as vLLM joins them; another part
    type is refused naming messages; an assistant message may have no content."""
    parts = _chat(client, {"role": "user", "content": [{"type": "text", "text": "Hello"},
                                                       {"type": "text", "text": "there"}]})
    joined = _chat(client, {"role": "user", "content": "Hello\nthere"})
    assert parts.status_code == joined.status_code == 200, parts.text
    assert parts.json()["usage"] == joined.json()["usage"]
    assert parts.json()["choices"][0]["message"] == joined.json()["choices"][0]["message"]
    image = {"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}
    r = _chat(client, {"role": "user", "content": [{"type": "text", "text": "Hi"}, image]})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages" and "only text content parts" in err["message"], err
    assert "'image_url'" in err["message"], err
    r = _chat(client, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": None},
              {"role": "user", "content": "Go on"}, max_tokens=1)
    assert r.status_code == 200, r.text
    r = _chat(client, {"role": "user", "content": None}, max_tokens=1)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
