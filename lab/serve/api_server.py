"""The OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions, /v1/models,
/health, /version, /metrics (the engine's `lab:` Prometheus metrics).

    app = build_app(AsyncLLM.from_config(cfg), "tiny_llama")   # in-process (tests)
    lab serve model=tiny_llama attention=torch --port 8000      # lab/cli.py

Streaming answers are server-sent events (`data: {json}\\n\\n`, then `data: [DONE]\\n\\n`). Bad
input is a 400 in OpenAI's error format naming the field, never a 500. A client that disconnects
mid-stream aborts its request (its KV blocks are freed).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from http import HTTPStatus
from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException

from lab.core.sampling_params import FIELDS, RequestOutputKind, SamplingParams
from lab.engine.async_llm import AsyncLLM
from lab.engine.core import EngineDeadError
from lab.frontend.outputs import CompletionOutput, Logprob, RequestOutput
from lab.metrics.prometheus import PrometheusLogger
from lab.serve.protocol import ChatCompletionRequest, CompletionRequest, _Sampling


class BadRequest(ValueError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def error_response(message: str, param: str | None = None, status: int = 400,
                   kind: str = "BadRequestError", headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                   "code": status}}, status_code=status, headers=headers)


_PARAM_PATTERNS = (re.compile(r"\(SamplingParams\.(\w+)\)"), re.compile(r"^(\w+)=",),
                   re.compile(r"^(\w+) must"))


def param_of(message: str) -> str | None:
    """The request field a lab ValueError names."""
    for pattern in _PARAM_PATTERNS:
        m = pattern.search(message)
        if m:
            return m.group(1)
    for name in ("prompt", "messages", *FIELDS):
        if re.search(rf"\b{name}\b", message):
            return name
    return None


def check_text(text: str, param: str, where: str | None = None) -> None:
    """A BadRequest naming `param` if `text` is no Unicode text: JSON's "\\ud800" escapes give
    lone surrogates, which the tokenizer refuses (a TypeError, not the client's 400)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadRequest(f"{where or param} is not valid Unicode text: a lone surrogate "
                         f"({text[e.start]!r}) at position {e.start}", param) from None


def lab_version() -> str:
    try:
        return version("lab")
    except PackageNotFoundError:
        return "0.1.0"


def build_app(async_llm: AsyncLLM, model_name: str = "lab") -> FastAPI:
    """The FastAPI app serving `async_llm` under the model name `model_name`."""
    app = FastAPI(title="lab OpenAI-compatible server", version=lab_version())
    app.state.async_llm = async_llm
    prom = next((lg for lg in async_llm.engine.loggers if isinstance(lg, PrometheusLogger)), None)
    if prom is None:
        prom = PrometheusLogger(model_name, textfile=None)
        async_llm.engine.loggers.append(prom)
    app.state.prometheus = prom
    created = int(time.time())

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            return error_response(f"malformed JSON body: {first.get('msg', '')}", "body")
        param = loc[0] if loc else None
        where = ".".join(loc) or "body"
        return error_response(f"{where}: {first.get('msg', 'invalid')}", param)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        """Starlette's own errors (404, 405, and FastAPI's 400 for a body json.loads refuses
        with no JSONDecodeError: bytes that are no UTF-8, deep nesting, a 5000-digit number)
        in OpenAI's format rather than {"detail": ...}."""
        kind = HTTPStatus(exc.status_code).phrase.replace(" ", "").replace("-", "")
        kind += "" if kind.endswith("Error") else "Error"
        message, param = str(exc.detail), None
        if exc.status_code == 400 and exc.__cause__ is not None:  # the body did not parse
            message, param = f"malformed JSON body: {exc.__cause__}", "body"
        return error_response(message, param, exc.status_code, kind, exc.headers)

    @app.exception_handler(BadRequest)
    async def _bad(_: Request, exc: BadRequest) -> JSONResponse:
        return error_response(str(exc), exc.param)

    @app.exception_handler(EngineDeadError)
    async def _dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        return error_response(str(exc), None, 503, "ServiceUnavailableError")

    @app.get("/health")
    async def health() -> PlainTextResponse:
        ok = async_llm.is_healthy
        return PlainTextResponse("" if ok else "engine dead", status_code=200 if ok else 503)

    @app.get("/version")
    async def version_() -> dict:
        return {"version": lab_version()}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": created, "owned_by": "lab",
            "root": model_name, "max_model_len": async_llm.max_model_len}]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(prom.exposition(),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request):
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            if len(prompt) != 1:
                raise BadRequest("prompt: lab serves one prompt per request (a string or a "
                                 "list of token ids)", "prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            check_text(prompt, "prompt")
        if body.echo:
            raise BadRequest("echo is not supported", "echo")
        if body.suffix is not None:
            raise BadRequest("suffix is not supported", "suffix")
        ids = prompt if isinstance(prompt, list) else await _tokenize(prompt)
        params = sampling_params(body, body.max_tokens, len(ids), async_llm.max_model_len,
                                 logprobs=body.logprobs)
        return await _serve(raw, ids, params, body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw: Request):
        for i, m in enumerate(body.messages):
            check_text(m.content, "messages", f"messages[{i}].content")
            check_text(m.name or "", "messages", f"messages[{i}].name")
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        try:
            ids = await async_llm.apply_chat_template(messages)
        except ValueError as e:
            raise BadRequest(str(e), "messages") from None
        if body.top_logprobs is not None and not body.logprobs:
            raise BadRequest("top_logprobs needs logprobs=true", "top_logprobs")
        most = async_llm.engine.processor.max_logprobs  # -1: no limit
        if body.top_logprobs is not None and (body.top_logprobs < 0 or most != -1
                                              and body.top_logprobs > most):
            allowed = f"in [0, {most}]" if most != -1 else "at least 0"
            raise BadRequest(f"top_logprobs must be an integer {allowed}, got "
                             f"{body.top_logprobs}", "top_logprobs")
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        name = "max_completion_tokens" if body.max_completion_tokens is not None \
            else "max_tokens"
        params = sampling_params(body, getattr(body, name), len(ids), async_llm.max_model_len,
                                 logprobs, name)
        return await _serve(raw, ids, params, body, chat=True)

    async def _tokenize(text: str) -> list[int]:
        if async_llm.tokenizer is None:
            raise BadRequest("this model has no tokenizer: give prompt as token ids", "prompt")
        return await async_llm.tokenize(text)

    async def _serve(raw: Request, ids: list[int], params: SamplingParams, body: _Sampling,
                     chat: bool):
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        top_k = (getattr(body, "top_logprobs", None) or 0) if chat else 0
        try:
            stream = await async_llm.add_request(ids, params, rid)
        except (ValueError, TypeError) as e:
            raise BadRequest(str(e), param_of(str(e))) from None
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            gen = _stream_events(stream, rid, chat, include_usage, body.logprobs, top_k)
            return StreamingResponse(gen, media_type="text/event-stream")
        final = None
        try:
            async for out in stream:  # DELTA outputs: accumulate them
                final = out if final is None else final.add_delta(out)
        except EngineDeadError as e:  # the engine is gone: the server is unhealthy
            return error_response(str(e), None, 503, "ServiceUnavailableError")
        except Exception as e:  # a failed step (not the client's fault)
            return error_response(str(e), None, 500, "InternalServerError")
        finally:
            stream.abort()  # no-op once finished; a cancelled handler lands here
        return JSONResponse(_full_response(final, rid, chat, body.logprobs, top_k))

    def _full_response(out: RequestOutput, rid: str, chat: bool, want_logprobs,
                       top_k: int = 0) -> dict:
        choices = []
        for c in sorted(out.outputs, key=lambda c: c.index):
            if chat:
                choice = {"index": c.index, "message": {"role": "assistant", "content": c.text},
                          "logprobs": _chat_logprobs(c, top_k) if want_logprobs else None,
                          "finish_reason": _finish(c.finish_reason),
                          "stop_reason": c.stop_reason}
            else:
                choice = {"index": c.index, "text": c.text,
                          "logprobs": _completion_logprobs(c) if want_logprobs is not None
                          else None,
                          "finish_reason": _finish(c.finish_reason), "stop_reason": c.stop_reason}
            choices.append(choice)
        n_out = sum(len(c.token_ids) for c in out.outputs)
        return {"id": rid, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": model_name, "choices": choices,
                "usage": _usage(len(out.prompt_token_ids), n_out)}

    async def _stream_events(stream, rid: str, chat: bool, include_usage: bool, want_logprobs,
                             top_k: int) -> AsyncIterator[str]:
        created_at = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        n_prompt, n_out = 0, 0
        started: set[int] = set()

        def chunk(choices: list[dict], usage: dict | None = None) -> str:
            data = {"id": rid, "object": obj, "created": created_at, "model": model_name,
                    "choices": choices}
            if include_usage:
                data["usage"] = usage
            return f"data: {json.dumps(data)}\n\n"

        try:
            async for out in stream:
                n_prompt = len(out.prompt_token_ids)
                for c in out.outputs:
                    n_out += len(c.token_ids)
                    if chat and c.index not in started:
                        started.add(c.index)
                        yield chunk([{"index": c.index, "delta": {"role": "assistant",
                                                                  "content": ""},
                                      "logprobs": None, "finish_reason": None}])
                    if not (c.text or c.token_ids or c.finish_reason):
                        continue
                    if chat:
                        choice = {"index": c.index, "delta": {"content": c.text} if c.text else {},
                                  "logprobs": _chat_logprobs(c, top_k) if want_logprobs else None}
                    else:
                        choice = {"index": c.index, "text": c.text,
                                  "logprobs": _completion_logprobs(c) if want_logprobs
                                  is not None else None}
                    choice["finish_reason"] = _finish(c.finish_reason)
                    choice["stop_reason"] = c.stop_reason
                    yield chunk([choice])
        except Exception as e:  # a failed step: tell the client in-band
            err = {"error": {"message": str(e), "type": "InternalServerError", "param": None,
                             "code": 500}}
            yield f"data: {json.dumps(err)}\n\n"
        finally:
            stream.abort()  # a disconnect (cancellation) lands here too
        if include_usage:
            yield chunk([], _usage(n_prompt, n_out))
        yield "data: [DONE]\n\n"

    return app


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _finish(reason: str | None) -> str | None:
    return reason


def sampling_params(body: _Sampling, max_tokens: int | None, prompt_len: int, max_model_len: int,
                    logprobs: int | None, name: str = "max_tokens") -> SamplingParams:
    """The request's SamplingParams (DELTA outputs); a bad value is a BadRequest naming it.
    `name` is the field max_tokens came from (chat's max_completion_tokens or max_tokens)."""
    room = max_model_len - prompt_len
    if max_tokens is not None and max_tokens < 1:
        raise BadRequest(f"{name} must be at least 1, got {max_tokens}", name)
    if max_tokens is not None and max_tokens > room:
        raise BadRequest(f"{name}={max_tokens} is too large: the prompt has {prompt_len} "
                         f"tokens and max_model_len={max_model_len} leaves room for {max(room, 0)}",
                         name)
    if max_tokens is None:
        max_tokens = max(room, 1)
    fields = {"n": body.n, "stop": body.stop or (), "stop_token_ids": body.stop_token_ids or (),
              "seed": body.seed, "ignore_eos": body.ignore_eos, "min_tokens": body.min_tokens,
              "max_tokens": max_tokens, "logprobs": logprobs, "logit_bias": body.logit_bias,
              "include_stop_str_in_output": body.include_stop_str_in_output,
              "skip_special_tokens": body.skip_special_tokens,
              "output_kind": RequestOutputKind.DELTA}
    for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                 "frequency_penalty", "repetition_penalty"):
        value = getattr(body, name)
        if value is not None:
            fields[name] = value
    try:
        params = SamplingParams(**fields)
    except (ValueError, TypeError) as e:
        raise BadRequest(str(e), param_of(str(e))) from None
    return replace(params, output_kind=RequestOutputKind.DELTA)


def _top(entries: dict[int, Logprob], k: int) -> list[tuple[int, Logprob]]:
    ranked = sorted(((t, lp) for t, lp in entries.items() if lp.rank is not None),
                    key=lambda x: x[1].rank)
    return [(t, lp) for t, lp in ranked if lp.rank <= k][:k] if k > 0 else []


def _completion_logprobs(c: CompletionOutput) -> dict | None:
    if c.logprobs is None:
        return None
    tokens, token_lps, tops, offsets = [], [], [], []
    offset = 0
    for tid, entries in zip(c.token_ids, c.logprobs):
        lp = entries.get(tid)
        text = (lp.decoded_token if lp else None) or ""
        tokens.append(text)
        token_lps.append(lp.logprob if lp else None)
        tops.append({(e.decoded_token or str(t)): e.logprob for t, e in entries.items()})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops,
            "text_offset": offsets}


def _chat_logprobs(c: CompletionOutput, k: int) -> dict | None:
    if c.logprobs is None:
        return None
    content = []
    for tid, entries in zip(c.token_ids, c.logprobs):
        lp = entries.get(tid)
        text = (lp.decoded_token if lp else None) or ""
        content.append({
            "token": text, "logprob": lp.logprob if lp else None,
            "bytes": list(text.encode()),
            "top_logprobs": [{"token": e.decoded_token or "", "logprob": e.logprob,
                              "bytes": list((e.decoded_token or "").encode())}
                             for _, e in _top(entries, k)]})
    return {"content": content}
