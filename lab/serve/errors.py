"""The server's errors, all in OpenAI's format: {"error": {"message", "type", "param", "code"}}.

Bad input is a 400 naming the field (`BadRequest`, pydantic's validation errors, a body that is
no JSON), a model the server does not serve a 404 naming `model` (`NotFound`), Starlette's own
errors keep their status (404, 405), a dead engine is a 503 (`EngineDeadError`).
`add_exception_handlers(app)` installs the handlers.
"""

from __future__ import annotations

import re
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from lab.core.sampling_params import FIELDS
from lab.engine.core import EngineDeadError


class ApiError(ValueError):
    """The client's mistake, answered with `status` and OpenAI's error `kind`, naming `param`,
    the request field at fault."""

    status, kind = 400, "BadRequestError"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class BadRequest(ApiError):
    """A 400: a field's value the server cannot serve."""


class NotFound(ApiError):
    """A 404: the request names something the server does not have (e.g. another model)."""

    status, kind = 404, "NotFoundError"


def error_object(message: str, param: str | None = None, status: int = 400,
                 kind: str = "BadRequestError") -> dict:
    """An error in OpenAI's format (the body of an error answer, or a stream's in-band event)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(message: str, param: str | None = None, status: int = 400,
                   kind: str = "BadRequestError", headers: dict | None = None) -> JSONResponse:
    """An error answer in OpenAI's format."""
    return JSONResponse(error_object(message, param, status, kind), status_code=status,
                        headers=headers)


def failure_object(error: BaseException) -> dict:
    """The error of a request the engine failed: 503 when the engine is gone (dead, hung or
    shut down: retry elsewhere), 500 when a step failed. A plain answer carries it as its body
    (and status), a stream as its last event: both say the same."""
    if isinstance(error, EngineDeadError):
        return error_object(str(error), None, 503, "ServiceUnavailableError")
    return error_object(str(error), None, 500, "InternalServerError")


def failure_response(error: BaseException) -> JSONResponse:
    """failure_object as an answer, with its status."""
    body = failure_object(error)
    return JSONResponse(body, status_code=body["error"]["code"])


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


async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
    """pydantic's first complaint about the body, as a 400 naming its field."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return error_response(f"malformed JSON body: {first.get('msg', '')}", "body")
    param = loc[0] if loc else None
    where = ".".join(loc) or "body"
    return error_response(f"{where}: {first.get('msg', 'invalid')}", param)


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


async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
    return error_response(str(exc), exc.param, exc.status, exc.kind)


async def _dead(_: Request, exc: EngineDeadError) -> JSONResponse:
    return failure_response(exc)


def add_exception_handlers(app: FastAPI) -> None:
    """Answer every error above in OpenAI's format."""
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(HTTPException, _http)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(EngineDeadError, _dead)
