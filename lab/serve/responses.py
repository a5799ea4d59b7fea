"""The bodies the completion endpoints answer with, from lab's RequestOutputs: one JSON
response (`text_completion` / `chat.completion`), or server-sent events
(`data: {chunk}\\n\\n` ... `data: [DONE]\\n\\n`), with OpenAI's logprobs and usage shapes.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from lab.engine.async_llm import RequestStream
from lab.frontend.outputs import CompletionOutput, Logprob, RequestOutput
from lab.serve.errors import failure_object


@dataclass(frozen=True)
class Reply:
    """How one request's answer is shaped: its id, the endpoint (chat or completions), the model
    name it reports, the logprobs asked for (completions: a count or None; chat: a flag) and
    chat's top_logprobs."""

    request_id: str
    chat: bool
    model: str
    logprobs: int | bool | None
    top_logprobs: int = 0

    @property
    def wants_logprobs(self) -> bool:
        return bool(self.logprobs) if self.chat else self.logprobs is not None

    def logprobs_of(self, c: CompletionOutput) -> dict | None:
        """The completion's logprobs in this endpoint's shape, or None when not asked."""
        if not self.wants_logprobs:
            return None
        return chat_logprobs(c, self.top_logprobs) if self.chat else completion_logprobs(c)


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def full_response(out: RequestOutput, reply: Reply) -> dict:
    """The whole answer of a request that was not streamed (`out`: its outputs merged)."""
    choices = []
    for c in sorted(out.outputs, key=lambda c: c.index):
        if reply.chat:
            choice = {"index": c.index, "message": {"role": "assistant", "content": c.text}}
        else:
            choice = {"index": c.index, "text": c.text}
        choices.append({**choice, "logprobs": reply.logprobs_of(c),
                        "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})
    n_out = sum(len(c.token_ids) for c in out.outputs)
    return {"id": reply.request_id,
            "object": "chat.completion" if reply.chat else "text_completion",
            "created": int(time.time()), "model": reply.model, "choices": choices,
            "usage": usage(len(out.prompt_token_ids), n_out)}


async def stream_events(stream: RequestStream, reply: Reply,
                        include_usage: bool) -> AsyncIterator[str]:
    """The request's outputs as server-sent events: a chunk per output that carries anything
    (chat: a role chunk first for each choice), an in-band error if a step fails, the usage
    chunk if asked, then [DONE]. Ending early (a client that disconnects) aborts the request."""
    created = int(time.time())
    n_prompt, n_out = 0, 0
    started: set[int] = set()

    def chunk(choices: list[dict], usage_: dict | None = None) -> str:
        data = {"id": reply.request_id,
                "object": "chat.completion.chunk" if reply.chat else "text_completion",
                "created": created, "model": reply.model, "choices": choices}
        if include_usage:
            data["usage"] = usage_
        return f"data: {json.dumps(data)}\n\n"

    try:
        async for out in stream:
            n_prompt = len(out.prompt_token_ids)
            for c in out.outputs:
                n_out += len(c.token_ids)
                if reply.chat and c.index not in started:
                    started.add(c.index)
                    yield chunk([{"index": c.index, "delta": {"role": "assistant", "content": ""},
                                  "logprobs": None, "finish_reason": None}])
                if c.text or c.token_ids or c.finish_reason:
                    yield chunk([_stream_choice(c, reply)])
    except Exception as e:  # the engine died or a step failed: tell the client in-band
        yield f"data: {json.dumps(failure_object(e))}\n\n"
    finally:
        stream.abort()  # a disconnect (cancellation) lands here too
    if include_usage:
        yield chunk([], usage(n_prompt, n_out))
    yield "data: [DONE]\n\n"


def _stream_choice(c: CompletionOutput, reply: Reply) -> dict:
    """One choice of a stream chunk: the new text (chat: as a delta) and its logprobs."""
    if reply.chat:
        choice = {"index": c.index, "delta": {"content": c.text} if c.text else {}}
    else:
        choice = {"index": c.index, "text": c.text}
    return {**choice, "logprobs": reply.logprobs_of(c), "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason}


def _top(entries: dict[int, Logprob], k: int) -> list[tuple[int, Logprob]]:
    ranked = sorted(((t, lp) for t, lp in entries.items() if lp.rank is not None),
                    key=lambda x: x[1].rank)
    return [(t, lp) for t, lp in ranked if lp.rank <= k][:k] if k > 0 else []


def completion_logprobs(c: CompletionOutput) -> dict | None:
    """The completions endpoint's logprobs: tokens, token_logprobs, top_logprobs, text_offset."""
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


def chat_logprobs(c: CompletionOutput, k: int) -> dict | None:
    """The chat endpoint's logprobs: per token its text, logprob, bytes and the top k."""
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
