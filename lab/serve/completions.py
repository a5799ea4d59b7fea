"""POST /v1/completions and /v1/chat/completions: a request body -> prompt ids and
SamplingParams -> AsyncLLM.add_request -> one JSON answer or a stream of events
(lab/serve/responses.py). Every bad value is a BadRequest naming its field, before the engine
sees the request.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from lab.core.sampling_params import RequestOutputKind, SamplingParams
from lab.engine.async_llm import AsyncLLM, RequestStream
from lab.serve.disconnect import CLIENT_GONE, unless_disconnected
from lab.serve.errors import BadRequest, check_text, failure_response, param_of
from lab.serve.protocol import ChatCompletionRequest, CompletionRequest, _Sampling
from lab.serve.responses import Reply, full_response, stream_events
from lab.serve.state import State

router = APIRouter(tags=["completions"])

#: the SamplingParams fields a body gives only when it sets them (else lab's defaults)
_OPTIONAL_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                    "frequency_penalty", "repetition_penalty")


@router.post("/v1/completions")
async def completions(body: CompletionRequest, state: State, request: Request):
    """A text completion of one prompt (a string, a one-string list, or token ids)."""
    llm = state.async_llm
    prompt = _one_prompt(body)
    if body.echo:
        raise BadRequest("echo is not supported", "echo")
    if body.suffix is not None:
        raise BadRequest("suffix is not supported", "suffix")
    ids = prompt if isinstance(prompt, list) else await _tokenize(llm, prompt)
    params = sampling_params(body, body.max_tokens, len(ids), llm.max_model_len,
                             logprobs=body.logprobs)
    reply = Reply(f"cmpl-{uuid.uuid4().hex}", False, state.model_name, body.logprobs)
    return await serve(llm, ids, params, body, reply, request)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, state: State, request: Request):
    """The assistant's next message after `messages`, through the model's chat template."""
    llm = state.async_llm
    ids = await _chat_prompt(llm, body)
    top = _top_logprobs(body, llm.max_logprobs)
    logprobs = top if body.logprobs else None
    name = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    params = sampling_params(body, getattr(body, name), len(ids), llm.max_model_len,
                             logprobs, name)
    reply = Reply(f"chatcmpl-{uuid.uuid4().hex}", True, state.model_name, body.logprobs, top)
    return await serve(llm, ids, params, body, reply, request)


async def serve(llm: AsyncLLM, ids: list[int], params: SamplingParams, body: _Sampling,
                reply: Reply, request: Request):
    """Queue the request; stream its events, or wait for it and answer once. The request ends
    with its answer or its client: a closed stream, a client that left before a plain answer
    or a cancelled handler aborts it."""
    try:
        stream = await llm.add_request(ids, params, reply.request_id)
    except (ValueError, TypeError) as e:
        raise BadRequest(str(e), param_of(str(e))) from None
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(stream_events(stream, reply, include_usage),
                                 media_type="text/event-stream")
    result = await unless_disconnected(request, _answer(stream, reply))
    if result is CLIENT_GONE:  # nobody reads it: 499, nginx's "client closed request"
        return Response(status_code=499)
    return result


async def _answer(stream: RequestStream, reply: Reply) -> JSONResponse:
    """The request's whole answer (or its error) once it finished."""
    final = None
    try:
        async for out in stream:  # DELTA outputs: accumulate them
            final = out if final is None else final.add_delta(out)
    except Exception as e:  # the engine died (503) or a step failed (500): not the client's
        return failure_response(e)
    finally:
        stream.abort()  # no-op once finished; a cancelled answer lands here
    return JSONResponse(full_response(final, reply))


def _one_prompt(body: CompletionRequest) -> str | list[int]:
    """The body's one prompt (a list of strings must hold exactly one), checked as text."""
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) != 1:
            raise BadRequest("prompt: lab serves one prompt per request (a string or a "
                             "list of token ids)", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        check_text(prompt, "prompt")
    return prompt


async def _tokenize(llm: AsyncLLM, text: str) -> list[int]:
    if llm.tokenizer is None:
        raise BadRequest("this model has no tokenizer: give prompt as token ids", "prompt")
    return await llm.tokenize(text)


async def _chat_prompt(llm: AsyncLLM, body: ChatCompletionRequest) -> list[int]:
    """The prompt ids of the messages under the model's chat template."""
    for i, m in enumerate(body.messages):
        check_text(m.content, "messages", f"messages[{i}].content")
        check_text(m.name or "", "messages", f"messages[{i}].name")
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    try:
        return await llm.apply_chat_template(messages)
    except ValueError as e:
        raise BadRequest(str(e), "messages") from None


def _top_logprobs(body: ChatCompletionRequest, most: int) -> int:
    """Chat's top_logprobs (0 when not given), checked against logprobs and `most` (the
    engine's max_logprobs; -1: no limit)."""
    top = body.top_logprobs
    if top is not None and not body.logprobs:
        raise BadRequest("top_logprobs needs logprobs=true", "top_logprobs")
    if top is not None and (top < 0 or most != -1 and top > most):
        allowed = f"in [0, {most}]" if most != -1 else "at least 0"
        raise BadRequest(f"top_logprobs must be an integer {allowed}, got {top}",
                         "top_logprobs")
    return top or 0


def sampling_params(body: _Sampling, max_tokens: int | None, prompt_len: int, max_model_len: int,
                    logprobs: int | None, name: str = "max_tokens") -> SamplingParams:
    """The request's SamplingParams (DELTA outputs); a bad value is a BadRequest naming it.
    `name` is the field max_tokens came from (chat's max_completion_tokens or max_tokens)."""
    max_tokens = _max_tokens(max_tokens, prompt_len, max_model_len, name)
    fields = {"n": body.n, "stop": body.stop or (), "stop_token_ids": body.stop_token_ids or (),
              "seed": body.seed, "ignore_eos": body.ignore_eos, "min_tokens": body.min_tokens,
              "max_tokens": max_tokens, "logprobs": logprobs, "logit_bias": body.logit_bias,
              "include_stop_str_in_output": body.include_stop_str_in_output,
              "skip_special_tokens": body.skip_special_tokens,
              "output_kind": RequestOutputKind.DELTA}
    fields.update({f: getattr(body, f) for f in _OPTIONAL_FIELDS if getattr(body, f) is not None})
    try:
        params = SamplingParams(**fields)
    except (ValueError, TypeError) as e:
        raise BadRequest(str(e), param_of(str(e))) from None
    return replace(params, output_kind=RequestOutputKind.DELTA)


def _max_tokens(max_tokens: int | None, prompt_len: int, max_model_len: int, name: str) -> int:
    """The tokens to generate: as asked if it fits beside the prompt, else a BadRequest; when
    not asked, what room the prompt leaves (at least 1)."""
    room = max_model_len - prompt_len
    if max_tokens is None:
        return max(room, 1)
    if max_tokens < 1:
        raise BadRequest(f"{name} must be at least 1, got {max_tokens}", name)
    if max_tokens > room:
        raise BadRequest(f"{name}={max_tokens} is too large: the prompt has {prompt_len} "
                         f"tokens and max_model_len={max_model_len} leaves room for {max(room, 0)}",
                         name)
    return max_tokens
