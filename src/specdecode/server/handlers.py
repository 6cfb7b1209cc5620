"""Every error the app answers, in the OpenAI error body (schemas.error_response): invalid bodies and
parameters (400, naming the parameter), FastAPI's HTTP errors, our ApiError, and a crash (500, logged
with the request's id, the connection closed)."""

from __future__ import annotations

import logging
import sys

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from specdecode.server.guard import request_id
from specdecode.server.schemas import ApiError, error_response

log = logging.getLogger("specdecode.server.app")  # the app's log: its name kept for log filters


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(HTTPException, _http)
    app.add_exception_handler(ApiError, _api)
    app.add_exception_handler(Exception, _crash)


async def _invalid(request, exc: RequestValidationError):
    errors = exc.errors()
    # a union (content: str | list of parts) reports each member; our own checks say the most
    first = next(
        (e for e in errors if not e.get("type", "").endswith("_type")),
        errors[0] if errors else {"loc": (), "msg": "invalid request"},
    )
    if first.get("type") == "json_invalid":  # loc is (body, character offset): not a parameter
        where = first.get("loc", ("", "?"))[-1]
        return error_response(
            400,
            f"the body is not valid JSON (at character {where}): "
            f"{first.get('ctx', {}).get('error', first.get('msg'))}",
            "invalid_request_error",
        )
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    param = ".".join(loc) or None
    return error_response(
        400, f"{param + ': ' if param else ''}{first.get('msg')}", "invalid_request_error", param
    )


async def _http(request, exc: HTTPException):
    kind = {401: "authentication_error", 404: "not_found_error", 413: "invalid_request_error"}
    message = str(exc.detail)
    if exc.status_code == 400 and exc.__cause__ is not None:  # FastAPI: "error parsing the body"
        message = unparsable(exc.__cause__)
    return error_response(exc.status_code, message, kind.get(exc.status_code, "invalid_request_error"))


async def _api(request, exc: ApiError):
    return exc.response()


async def _crash(request, exc: Exception):
    log.exception("request %s failed", request_id(request.scope), exc_info=exc)
    return error_response(500, "internal server error", "internal_error", headers={"Connection": "close"})


def unparsable(cause: BaseException) -> str:
    """Why the JSON parser rejected a body, naming the cause (FastAPI says only that it failed)."""
    if isinstance(cause, UnicodeDecodeError):
        byte = cause.object[cause.start : cause.start + 1].hex()
        return f"the body is not valid {cause.encoding.upper()} (byte 0x{byte} at offset {cause.start})"
    if isinstance(cause, RecursionError):
        return "the body's JSON is nested too deeply"
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):
        return f"the body has an integer of more than {sys.get_int_max_str_digits()} digits"
    return f"the body could not be parsed as JSON: {type(cause).__name__}: {cause}"
