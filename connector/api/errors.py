"""HTTP edge: every error is a `sensorium-error.v1` with a stable code and no echo of the input."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from connector.contract import strict_json
from connector.errors import Code, SensoriumError
from connector.service.answers import Accepted, Answer, Created, Done, Gone, public_refusal

_log = logging.getLogger("sensorium.api")

DEFAULT_MAX_BODY_BYTES = 65536
_CODE_BY_STATUS = {
    404: Code.NOT_FOUND,
    405: Code.METHOD_NOT_ALLOWED,
    413: Code.BODY_TOO_LARGE,
    400: Code.INVALID_JSON,
}


class JsonResponse(Response):
    """Compact UTF-8 JSON."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        """Serialise without insignificant whitespace."""
        return json.dumps(content, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def to_response(answer: Answer) -> Response:
    """A service answer as an HTTP response: 202 with `Location` and `Retry-After`, 200, 201 or 204."""
    match answer:
        case Accepted():
            headers = {"Location": answer.status_path, "Retry-After": str(answer.retry_after_seconds)}
            return JsonResponse(dict(answer.handle), status_code=202, headers=headers)
        case Done():
            return JsonResponse(dict(answer.document))
        case Created():
            return JsonResponse(dict(answer.document), status_code=201)
        case Gone():
            return Response(status_code=204)


def refusal_response(error: SensoriumError) -> Response:
    """A `sensorium-error.v1` with the code's status; `Retry-After` travels as a header too."""
    error = public_refusal(error)
    headers = {}
    if error.retry_after_seconds is not None:
        headers["Retry-After"] = str(error.retry_after_seconds)
    return JsonResponse(error.to_document(), status_code=error.http_status, headers=headers)


def error_response(code: str, message: str, *, diagnostics: Sequence[Mapping[str, str]] = ()) -> Response:
    """A refusal built from a code."""
    return refusal_response(SensoriumError(message, code=code, diagnostics=diagnostics))


def install_error_handlers(app: FastAPI) -> None:
    """Map refusals and framework errors (404, 405, 422, 500) to `sensorium-error.v1`."""

    async def on_refusal(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, SensoriumError)
        return refusal_response(exc)

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = _CODE_BY_STATUS.get(
            exc.status_code, Code.INTERNAL if exc.status_code >= 500 else Code.NOT_FOUND
        )
        response = error_response(code, code.replace("-", " "))
        response.status_code = exc.status_code
        if exc.status_code == 405:
            response.headers["Allow"] = ", ".join(allowed_methods(request))
        return response

    async def on_validation(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        locs = sorted({tuple(str(p) for p in err.get("loc", ())) for err in exc.errors()})[:16]
        diagnostics = [{"code": Code.INVALID_INPUT, "message": f"/{'/'.join(loc)}: invalid"} for loc in locs]
        names = ", ".join(_parameter_of(loc) for loc in locs)
        return error_response(Code.INVALID_INPUT, f"{names}: {_RULE}", diagnostics=diagnostics)

    app.add_exception_handler(SensoriumError, on_refusal)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)


# Every parameter a route declares is an integer >= 0 or a member of a listed set (see /openapi.json).
_RULE = "not an allowed value (see /openapi.json)"
_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _parameter_of(loc: Sequence[Any]) -> str:
    """`query parameter wait_seconds` from pydantic's `("query", "wait_seconds")`: our names, not values."""
    where, name = (loc[0], loc[1]) if len(loc) >= 2 else ("request", "body")
    return f"{where} parameter {name}"  # `where` is pydantic's location kind, `name` our parameter


def allowed_methods(request: Request) -> list[str]:
    """Every method some route of this app answers on the request's path (for `Allow`)."""
    routes = request.app.router.routes
    return [
        method
        for method in _METHODS
        if any(route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes)
    ]


class InternalErrors:
    """ASGI middleware: an unexpected exception answers 500 `internal`, logged by its type name only.

    Starlette's own handler would re-raise, and the server would log a traceback whose text can quote
    request or device data; nothing of the exception but its type leaves this middleware.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app; turn an escaping exception into a `sensorium-error.v1` when nothing was sent yet."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as error:
            _log.error("request failed with an unexpected %s", type(error).__name__)
            if not started:
                await error_response(Code.INTERNAL, "internal error")(scope, receive, send)


class BodyLimit:
    """ASGI middleware: refuse request bodies over `max_bytes` with 413 `body-too-large`."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Buffer at most `max_bytes` of the body, then hand it to the app in one message."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if delivered:
                return await receive()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(Code.BODY_TOO_LARGE, "the request body is too large")
        await response(scope, receive, send)


def parse_json_body(raw: bytes, *, directive: bool = False) -> Any:
    """The request body as strict JSON (`connector.contract.strict_json`): 400 `invalid-json` or 422."""
    return strict_json.loads(raw, directive_at=() if directive else None)


def bearer_token(request: Request) -> str | None:
    """The token of `Authorization: Bearer <token>`, else None."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()
