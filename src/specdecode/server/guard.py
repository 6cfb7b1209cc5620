"""What the server checks before any parsing (pure ASGI, in front of the FastAPI app).

In order: the request id (the client's `X-Request-Id`, or a fresh one; every response carries it and
so do the server's log lines about the request), the API key on /v1/* and /stats, the Content-Type
of a POST to /v1/* (JSON only, so a `text/plain` body is told so rather than "Input should be a
valid dictionary"), and the body size (Content-Length, and counted while a chunked body streams in).
"""

from __future__ import annotations

import hmac
import re
import uuid

from starlette.exceptions import HTTPException

from specdecode.server.schemas import error_response

REQUEST_ID = re.compile(r"[A-Za-z0-9._~:/+=@-]{1,128}")  # echoed into headers and logs: nothing else


def request_id(scope) -> str:
    """The id Guard gave this request (scope["state"], as Starlette's request.state reads it)."""
    return scope["state"]["request_id"]


def _is_json(content_type: bytes) -> bool:
    media = content_type.split(b";")[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


class Guard:
    PROTECTED = ("/v1/", "/stats")

    def __init__(self, app, api_key: str | None, max_body_bytes: int):
        self.app, self.max_body = app, max_body_bytes
        self.key = api_key.encode() if api_key else None

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)

    def _refusal(self, scope, headers: dict[bytes, bytes], given_id: bytes):
        """The error response for a request refused before parsing, or None."""
        if given_id and not REQUEST_ID.fullmatch(given_id.decode("latin-1")):
            return error_response(
                400,
                "X-Request-Id must be 1 to 128 characters of letters, digits and ._~:/+=@-",
                "invalid_request_error",
                code="invalid_request_id",
            )
        if self.key and scope["path"].startswith(self.PROTECTED) and not self._authorized(headers):
            return error_response(
                401,
                "missing or invalid API key (Authorization: Bearer <key>)",
                "authentication_error",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if scope["method"] == "POST" and scope["path"].startswith("/v1/"):
            content_type = headers.get(b"content-type")
            if content_type is None or not _is_json(content_type):
                got = (
                    "the request has no Content-Type header"
                    if content_type is None
                    else f"got Content-Type {content_type.decode('latin-1')!r}"
                )
                return error_response(
                    400,
                    f"the body must be JSON (Content-Type: application/json); {got}",
                    "invalid_request_error",
                    code="invalid_content_type",
                )
        length = headers.get(b"content-length", b"0")
        if not length.isdigit():
            return error_response(400, "invalid Content-Length", "invalid_request_error")
        if int(length) > self.max_body:
            return error_response(
                413, f"request body larger than {self.max_body} bytes", "invalid_request_error"
            )
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        given = headers.get(b"x-request-id", b"")
        valid = given and REQUEST_ID.fullmatch(given.decode("latin-1"))
        rid = given.decode("latin-1") if valid else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid

        async def tagged(message):  # every response, errors included, names the request
            if message["type"] == "http.response.start":
                message = {
                    **message,
                    "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())],
                }
            await send(message)

        refusal = self._refusal(scope, headers, given)
        if refusal is not None:
            return await refusal(scope, receive, tagged)
        seen = 0

        async def counted():  # chunked bodies carry no Content-Length: count as they arrive
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body:
                raise HTTPException(413, f"request body larger than {self.max_body} bytes")
            return message

        return await self.app(scope, counted, tagged)
