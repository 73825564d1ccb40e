"""Every answer the suite sees over httpx is checked against the server's own `/openapi.json`.

`install` (called by `tests/conftest.py`) wraps httpx's ASGI transport (in-process apps) and its HTTP
transports for loopback servers (`serve` subprocesses; their document is fetched once per origin through
the same transport). A response on a documented path must
have a documented status, content type, required headers and a body valid against the declared schema (the
canonical components, validated with the same wire rules as `schemas/`). A method the document lacks on a
documented path must answer 405 with `Allow`. So the document and the server cannot drift apart.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import httpx
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from connector.contract.schemas import wire_validator

_DOC_URI = "urn:sensorium:openapi"
_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


class Mismatch(AssertionError):
    """A response the OpenAPI document does not describe."""


def _escape(part: str) -> str:
    return part.replace("~", "~0").replace("/", "~1")


@lru_cache(maxsize=32)
def _compiled(document_json: str) -> tuple[dict[str, Any], list[tuple[re.Pattern[str], str]], Registry[Any]]:
    document = json.loads(document_json)
    templates = []
    for template in document.get("paths", {}):
        pattern = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$"
        templates.append((re.compile(pattern), template))
    registry: Registry[Any] = Registry().with_resource(_DOC_URI, DRAFT202012.create_resource(document))
    return document, templates, registry


def documented(app: Any) -> str | None:
    """The app's OpenAPI document as JSON text, or None for an app without one."""
    cached = getattr(app, "_sensorium_openapi_json", None)
    if cached is not None:
        return str(cached)
    openapi = getattr(app, "openapi", None)
    if openapi is None:
        return None
    text = json.dumps(openapi(), sort_keys=True)
    app._sensorium_openapi_json = text  # built once per app, as the app builds its own once
    return text


def covers(document_json: str, path: str) -> bool:
    """True when `path` matches a path template of the document."""
    return any(pattern.match(path) for pattern, _ in _compiled(document_json)[1])


_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
_served: dict[str, str | None] = {}


def forget_served() -> None:
    """Drop the documents fetched from loopback servers (a later server may reuse a port)."""
    _served.clear()


def _origin(request: httpx.Request) -> str | None:
    url = request.url
    if url.host not in _LOOPBACK or url.path == "/openapi.json":
        return None
    return f"{url.scheme}://{url.host}:{url.port}"


def _served_document(response: httpx.Response) -> str | None:
    if response.status_code != 200:
        return None
    try:
        body = response.json()
    except ValueError:
        return None
    return json.dumps(body, sort_keys=True) if isinstance(body, dict) and "openapi" in body else None


def install(mismatches: list[str]) -> None:
    """Wrap httpx's transports so that each answer is checked; findings also go to `mismatches`."""
    asgi = httpx.ASGITransport.handle_async_request
    if getattr(asgi, "_sensorium_checked", False):
        return

    def record(document: str, request: httpx.Request, response: httpx.Response) -> None:
        try:
            check(document, request, response)
        except Mismatch as mismatch:
            mismatches.append(str(mismatch))
            raise

    async def checked_asgi(self: httpx.ASGITransport, request: httpx.Request) -> httpx.Response:
        response = await asgi(self, request)
        document = documented(self.app)
        if document is not None and covers(document, request.url.path):
            await response.aread()
            record(document, request, response)
        return response

    network_async = httpx.AsyncHTTPTransport.handle_async_request

    async def checked_async(self: httpx.AsyncHTTPTransport, request: httpx.Request) -> httpx.Response:
        response = await network_async(self, request)
        origin = _origin(request)
        if origin is None:
            return response
        if origin not in _served:
            fetched = await network_async(self, httpx.Request("GET", origin + "/openapi.json"))
            await fetched.aread()
            _served[origin] = _served_document(fetched)
        document = _served[origin]
        if document is not None and covers(document, request.url.path):
            await response.aread()
            record(document, request, response)
        return response

    network_sync = httpx.HTTPTransport.handle_request

    def checked_sync(self: httpx.HTTPTransport, request: httpx.Request) -> httpx.Response:
        response = network_sync(self, request)
        origin = _origin(request)
        if origin is None:
            return response
        if origin not in _served:
            fetched = network_sync(self, httpx.Request("GET", origin + "/openapi.json"))
            fetched.read()
            _served[origin] = _served_document(fetched)
        document = _served[origin]
        if document is not None and covers(document, request.url.path):
            response.read()
            record(document, request, response)
        return response

    checked_asgi._sensorium_checked = True  # type: ignore[attr-defined]
    httpx.ASGITransport.handle_async_request = checked_asgi  # type: ignore[method-assign]
    httpx.AsyncHTTPTransport.handle_async_request = checked_async  # type: ignore[method-assign]
    httpx.HTTPTransport.handle_request = checked_sync  # type: ignore[method-assign]


def check(document_json: str, request: httpx.Request, response: httpx.Response) -> None:
    """Raise `Mismatch` when `response` is not what the document says this request can get."""
    document, templates, registry = _compiled(document_json)
    template = next((t for pattern, t in templates if pattern.match(request.url.path)), None)
    if template is None:
        return  # not an API path (console pages, /openapi.json itself, unknown paths)
    operations = document["paths"][template]
    method = request.method.lower()
    where = f"{request.method} {template} -> {response.status_code}"
    if method not in operations:
        _check_405(operations, response, where)
        return
    answers = operations[method]["responses"]
    answer = answers.get(str(response.status_code))
    if answer is None:
        raise Mismatch(f"{where}: status not documented (documented: {sorted(answers)})")
    _check_headers(answer, response, where)
    _check_body(template, method, answer, response, registry, where)


def _check_405(operations: Mapping[str, Any], response: httpx.Response, where: str) -> None:
    if response.status_code != 405:
        raise Mismatch(f"{where}: an undocumented method must answer 405")
    allowed = {m.strip().lower() for m in response.headers.get("allow", "").split(",") if m.strip()}
    documented_methods = {m for m in operations if m in _METHODS}
    if not documented_methods <= allowed:
        raise Mismatch(f"{where}: Allow lacks documented methods {sorted(documented_methods - allowed)}")


def _check_headers(answer: Mapping[str, Any], response: httpx.Response, where: str) -> None:
    for name, header in answer.get("headers", {}).items():
        value = response.headers.get(name)
        if value is None:
            if header.get("required"):
                raise Mismatch(f"{where}: required header {name} missing")
            continue
        errors = list(wire_validator(header["schema"]).iter_errors(value))
        if errors:
            raise Mismatch(f"{where}: header {name} breaks its schema")


def _check_body(
    template: str,
    method: str,
    answer: Mapping[str, Any],
    response: httpx.Response,
    registry: Registry[Any],
    where: str,
) -> None:
    content = answer.get("content")
    if not content:
        if response.content:
            raise Mismatch(f"{where}: a body where the document declares none")
        return
    media = response.headers.get("content-type", "").split(";")[0].strip()
    if media not in content:
        raise Mismatch(f"{where}: content type {media!r} not documented ({sorted(content)})")
    if media != "application/json":
        return
    pointer = "/".join(
        _escape(p)
        for p in ("paths", template, method, "responses", str(response.status_code), "content", media)
    )
    validator = wire_validator({"$ref": f"{_DOC_URI}#/{pointer}/schema"}, registry=registry)
    errors = sorted(validator.iter_errors(response.json()), key=lambda e: list(e.absolute_path))
    if errors:
        paths = ["/" + "/".join(str(p) for p in e.absolute_path) + f" ({e.validator})" for e in errors[:5]]
        raise Mismatch(f"{where}: body breaks the documented schema at {paths}")
