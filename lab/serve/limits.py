"""What a server lets in, checked before any route runs: the API key, the body size and the
number of generation requests in flight. Each is a small ASGI middleware (pure ASGI, so a
streamed answer passes through untouched and a request is counted until its last byte went).

    ServerLimits(api_key="K", max_body_bytes=1 << 20, max_concurrent_requests=64)

- `api_key`: every `/v1/*` request needs `Authorization: Bearer <key>`, else 401 (vLLM's
  `--api-key`); `/health`, `/version` and `/metrics` stay open.
- `max_body_bytes`: a larger body is refused with 413 before it is parsed: at once when its
  Content-Length says so, else as soon as the bytes read pass the limit (nothing is buffered
  beyond it).
- `max_concurrent_requests`: a completion beyond this many in flight gets 429 at once (a
  client backs off) instead of queueing without bound.
- `max_n`: the most completions one request may ask for (`n`; a larger one is a 400 naming
  it); vLLM's default cap (VLLM_MAX_N_SEQUENCES).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lab.core.sampling_params import MAX_N
from lab.serve.errors import error_response

#: the routes that generate (counted against max_concurrent_requests)
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")


@dataclass(frozen=True)
class ServerLimits:
    """A server's admission rules (see the module docstring); None: no such rule."""

    api_key: str | None = None
    max_body_bytes: int | None = 16 * 1024 * 1024
    max_concurrent_requests: int | None = None
    max_n: int = MAX_N

    def __post_init__(self) -> None:
        if not isinstance(self.max_n, int) or not 1 <= self.max_n <= MAX_N:
            raise ValueError(f"max_n must be an integer in [1, {MAX_N}], got {self.max_n!r}")
        for name in ("max_body_bytes", "max_concurrent_requests"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty (None: no key needed)")


def add_limits(app, limits: ServerLimits) -> None:
    """Install the middlewares `limits` asks for; the key is checked first, so a caller without
    it learns nothing else (Starlette runs the last added outermost)."""
    if limits.max_concurrent_requests is not None:
        app.add_middleware(ConcurrencyLimit, most=limits.max_concurrent_requests)
    if limits.max_body_bytes is not None:
        app.add_middleware(BodyLimit, most=limits.max_body_bytes)
    if limits.api_key is not None:
        app.add_middleware(ApiKey, key=limits.api_key)


async def send_error(scope: Scope, receive: Receive, send: Send, status: int, kind: str,
                     message: str, param: str | None = None,
                     headers: dict[str, str] | None = None) -> None:
    """An error answer in OpenAI's format (errors.py's), sent straight through ASGI."""
    await error_response(message, param, status, kind, headers)(scope, receive, send)


class ApiKey:
    """401 for a `/v1/*` request without `Authorization: Bearer <key>` (compared in constant
    time); CORS preflights (OPTIONS) pass, as in vLLM."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope.get("method") != "OPTIONS"
                and scope["path"].startswith("/v1")):
            given = Headers(scope=scope).get("authorization", "").encode("latin-1")
            if not secrets.compare_digest(given, self.expected):
                await send_error(scope, receive, send, 401, "AuthenticationError",
                                 "missing or wrong API key: send 'Authorization: Bearer <key>'",
                                 headers={"www-authenticate": "Bearer"})
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """413 for a body over `most` bytes, before the app parses it (see the module docstring).
    The body is read here (the app would read all of it anyway) and handed on whole."""

    def __init__(self, app: ASGIApp, most: int) -> None:
        self.app, self.most = app, most

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length", "")
        if length.isdigit() and int(length) > self.most:
            await self.refuse(scope, receive, send, int(length))
            return
        chunks, seen = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left while sending
                return
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.most:
                await self.refuse(scope, receive, send, seen)
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def refuse(self, scope: Scope, receive: Receive, send: Send, size: int) -> None:
        await send_error(scope, receive, send, 413, "RequestTooLargeError",
                         f"the request body has at least {size} bytes; this server takes at "
                         f"most {self.most} (lab serve --max-body-bytes)", "body")


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives `body` as one message, then whatever the client sends next (its
    disconnect)."""
    pending = True

    async def replayed() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


class ConcurrencyLimit:
    """429 for a generation request beyond `most` in flight; a request counts until its
    answer's last byte went (a stream, until it ends)."""

    def __init__(self, app: ASGIApp, most: int) -> None:
        self.app, self.most, self.active = app, most, 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in GENERATION_PATHS:
            await self.app(scope, receive, send)
            return
        if self.active >= self.most:
            await send_error(scope, receive, send, 429, "TooManyRequestsError",
                             f"{self.active} requests are in flight, the most this server takes "
                             f"(lab serve --max-concurrent-requests); retry later",
                             headers={"retry-after": "1"})
            return
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1
