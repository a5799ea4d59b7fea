"""POST /v1/completions and /v1/chat/completions: a request body -> prompt ids and
SamplingParams -> AsyncLLM.add_request -> one JSON answer or a stream of events
(lab/serve/responses.py). Every bad value is a BadRequest naming its field, before the engine
sees the request; a model the server does not serve is a 404 (vLLM's order: the model first).

The cheap checks come before the prompt is tokenized, and a text prompt too long to fit the
context is refused before it is tokenized too, by a lower bound on its token count
(Tokenizer.min_num_tokens): megabytes of text never hold the tokenizer's thread. A prompt
that fills the context is blamed on itself (`prompt`, chat's `messages`); max_tokens only when
the prompt fits and max_tokens does not fit beside it.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from lab.core.sampling_params import RequestOutputKind, SamplingParams
from lab.engine.async_llm import AsyncLLM, RequestStream
from lab.serve.disconnect import CLIENT_GONE, unless_disconnected
from lab.serve.errors import BadRequest, NotFound, check_text, failure_response, param_of
from lab.serve.protocol import ChatCompletionRequest, CompletionRequest, _Sampling
from lab.serve.responses import Reply, full_response, stream_events
from lab.serve.state import ServerState, State

router = APIRouter(tags=["completions"])

#: the SamplingParams fields a body gives only when it sets them (else lab's defaults)
_OPTIONAL_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                    "frequency_penalty", "repetition_penalty")


@router.post("/v1/completions")
async def completions(body: CompletionRequest, state: State, request: Request):
    """A text completion of one prompt (a string, a one-string list, or token ids)."""
    llm = state.async_llm
    check_before_prompt(body, state)
    prompt = _one_prompt(body)
    if body.echo:
        raise BadRequest("echo is not supported", "echo")
    if body.suffix is not None:
        raise BadRequest("suffix is not supported", "suffix")
    ids = prompt if isinstance(prompt, list) else await _tokenize(llm, prompt, "prompt")
    check_prompt_fits(len(ids), llm.max_model_len, "prompt")
    params = sampling_params(body, body.max_tokens, len(ids), llm.max_model_len,
                             logprobs=body.logprobs)
    reply = Reply(f"cmpl-{uuid.uuid4().hex}", False, state.model_name, body.logprobs)
    return await serve(llm, ids, params, body, reply, request)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, state: State, request: Request):
    """The assistant's next message after `messages`, through the model's chat template."""
    llm = state.async_llm
    check_before_prompt(body, state)
    top = _top_logprobs(body, llm.max_logprobs)
    ids = await _chat_prompt(llm, body)
    check_prompt_fits(len(ids), llm.max_model_len, "messages")
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


# -- checks before the prompt is tokenized ----------------------------------------------------
def check_before_prompt(body: _Sampling, state: ServerState) -> None:
    """The checks that need no tokenizing, in vLLM's order: the model, then the fields."""
    check_model(body.model, state.model_name)
    if body.stream_options is not None and body.stream_options.model_fields_set \
            and not body.stream:  # vLLM refuses stream_options when truthy ({} passes)
        raise BadRequest("Stream options (stream_options) can only be defined when "
                         "`stream=True`.", "stream_options")
    if body.n > state.limits.max_n:
        raise BadRequest(f"n must be at most {state.limits.max_n} (this server's max_n), got "
                         f"{body.n}", "n")
    check_logit_bias(body.logit_bias, state.async_llm.vocab_size)
    stops = [body.stop] if isinstance(body.stop, str) else body.stop or []
    for i, stop in enumerate(stops):
        check_text(stop, "stop", "stop" if isinstance(body.stop, str) else f"stop[{i}]")


def check_model(model: str | None, served: str) -> None:
    """vLLM's rule: no model (or an empty name) asks for the served one; another is a 404."""
    if model and model != served:
        check_text(model, "model")  # a lone surrogate cannot be echoed back as JSON
        raise NotFound(f"The model `{model}` does not exist.", "model")


def check_logit_bias(bias: dict[str, float] | None, vocab_size: int) -> None:
    """What OpenAI's API adds to the engine's own checks (integer keys: SamplingParams; keys in
    the vocabulary: the Processor): at most one entry per token id, counted first in O(1) so a
    body of 10**6 keys is refused before any per-key work, and each bias in [-100, 100]."""
    if not bias:
        return
    if len(bias) > vocab_size:
        raise BadRequest(f"logit_bias has {len(bias)} entries, more than the {vocab_size} token "
                         "ids of the vocabulary", "logit_bias")
    for key, value in bias.items():
        if not -100 <= value <= 100:
            raise BadRequest(f"logit_bias values must be in [-100, 100], got {value!r} for "
                             f"token {key}", "logit_bias")


# -- the prompt ----------------------------------------------------------------------------
async def _tokenize(llm: AsyncLLM, text: str, param: str,
                    add_special_tokens: bool = True) -> list[int]:
    """The text's token ids, unless a lower bound on their count already fills the context
    (then refused at once, untokenized)."""
    if llm.tokenizer is None:
        raise BadRequest(f"this model has no tokenizer: give {param} as token ids", param)
    least = llm.tokenizer.min_num_tokens(text)
    if least >= llm.max_model_len:
        raise BadRequest(_too_long(param, f"at least {least} tokens ({len(text)} characters)",
                                   llm.max_model_len), param)
    return await llm.tokenize(text, add_special_tokens)


def check_prompt_fits(num_tokens: int, max_model_len: int, param: str) -> None:
    """A BadRequest naming the prompt's field (`prompt`, or chat's `messages`) when the prompt
    alone leaves no room for an output token."""
    if num_tokens >= max_model_len:
        raise BadRequest(_too_long(param, f"{num_tokens} tokens", max_model_len), param)


def _too_long(param: str, size: str, max_model_len: int) -> str:
    """vLLM's message, naming the field to shorten."""
    prompt = "the chat prompt (the messages in the chat template)" if param == "messages" \
        else "the prompt"
    return (f"{param}: {prompt} has {size}, but this model's maximum context length is "
            f"{max_model_len} tokens (max_model_len), which leaves no room for an output "
            f"token; shorten {param}")


async def _chat_prompt(llm: AsyncLLM, body: ChatCompletionRequest) -> list[int]:
    """The prompt ids of the messages under the model's chat template: rendered as text
    first, so that a text too long is refused before it is tokenized."""
    messages = []
    for i, m in enumerate(body.messages):
        text = m.text
        check_text(text, "messages", f"messages[{i}].content")
        check_text(m.name or "", "messages", f"messages[{i}].name")
        messages.append({"role": m.role, "content": text}
                        | ({"name": m.name} if m.name is not None else {}))
    try:
        rendered = await llm.render_chat(messages)
    except ValueError as e:
        raise BadRequest(str(e), "messages") from None
    return await _tokenize(llm, rendered, "messages", add_special_tokens=False)


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
              "skip_special_tokens": body.skip_special_tokens, "extra_args": body.vllm_xargs,
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
