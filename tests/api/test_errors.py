"""CONTRACT §14 at the HTTP edge: every refusal is a `sensorium-error.v1` with the right status and code, and
no
response (nor log record) echoes what the request carried."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.support import CANARY, RecordingFactory, assert_error, harness
from tests.support.directives import command_directive, scan_directive


def _server_log(caplog: pytest.LogCaptureFixture) -> str:
    """Everything the connector logged (the test's own httpx client logs its request lines)."""
    records = [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    return "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in records)


OP = "/v1/operations/deferred:sensorium.directive.invoke:AAAAAAAAAAAAAAAAAAAAAAAAAA"


@pytest.mark.asyncio
async def test_routes_and_methods_that_do_not_exist(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory()) as h:
        for path in ("/nope", "/v1/operations", "/v1/bindings/x/y", f"/{CANARY}"):
            response = await h.client.get(path, headers=h.auth("alice"))
            assert_error(response, 404, "not-found")
            assert CANARY not in response.text
        for method, path in (("PUT", "/v1/directives"), ("GET", "/v1/directives"), ("DELETE", "/v1/catalog")):
            response = await h.client.request(method, path, headers=h.auth("alice"))
            assert_error(response, 405, "method-not-allowed")
            assert response.headers["Allow"] == {"/v1/directives": "POST", "/v1/catalog": "GET"}[path]


@pytest.mark.asyncio
async def test_open_routes_need_no_token(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory()) as h:
        assert (await h.client.get("/healthz")).json() == {"status": "ok"}
        metrics = await h.client.get("/metrics")
        assert metrics.status_code == 200 and "sensorium_discovery_sessions_active" in metrics.text
        assert (await h.client.get("/openapi.json")).json()["paths"]


async def _chunks(total: int, size: int = 256) -> AsyncIterator[bytes]:
    sent = 0
    while sent < total:
        yield (CANARY + " " * size)[:size].encode()
        sent += size


@pytest.mark.asyncio
async def test_bodies_over_the_limit_declared_or_streamed(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(), max_body_bytes=1024) as h:
        big = {"schema": "sensorium-directive.v1", "pad": CANARY * 100}
        declared = await h.client.post("/v1/directives", json=big, headers=h.auth("alice"))
        assert_error(declared, 413, "body-too-large")
        streamed = await h.client.post("/v1/directives", content=_chunks(4096), headers=h.auth("alice"))
        assert "content-length" not in streamed.request.headers
        assert_error(streamed, 413, "body-too-large")
        # The limit applies before authentication (it protects it), and to every route with a body.
        anonymous = await h.client.post(OP + "/bindings", content=_chunks(2048))
        assert_error(anonymous, 413, "body-too-large")
        for response in (declared, streamed, anonymous):
            assert CANARY not in response.text
        # Just under the limit is read normally (and refused for what it is).
        small = await h.client.post(
            "/v1/directives", content=b"[" + b" " * 1000 + b"]", headers=h.auth("alice")
        )
        assert_error(small, 422, "invalid-directive")


@pytest.mark.asyncio
async def test_bodies_that_are_not_json(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory()) as h:
        bodies = [
            b"{" + CANARY.encode(),
            b"",
            b"\xff\xfe" + CANARY.encode(),
            b'{"x": NaN}',
            b"[" * 5000 + b"]" * 5000,
            b'{"a":' * 100 + b"1" + b"}" * 100,
        ]
        for path in ("/v1/directives", OP + "/selection", OP + "/bindings"):
            for body in bodies:
                response = await h.client.post(path, content=body, headers=h.auth("alice"))
                assert_error(response, 400, "invalid-json")
                assert CANARY not in response.text


@pytest.mark.asyncio
async def test_bad_query_parameters(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory()) as h:
        for params in (
            {"wait_seconds": CANARY},
            {"wait_seconds": "-1"},
            {"after_revision": "-5"},
            {"wait_seconds": "1.5"},
        ):
            response = await h.client.get(OP, params=params, headers=h.auth("alice"))
            body = assert_error(response, 422, "invalid-input")
            name = next(iter(params))
            assert body["diagnostics"] == [{"code": "invalid-input", "message": f"/query/{name}: invalid"}]
            assert body["message"].startswith(f"query parameter {name}: ")
            assert CANARY not in response.text


@pytest.mark.asyncio
async def test_an_unexpected_exception_is_internal_without_detail(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO)  # what `serve` logs at
    async with harness(tmp_path, factory=RecordingFactory()) as h:

        async def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"device {CANARY} at 02:00:00:00:00:01")

        monkeypatch.setattr(h.assembled.service, "status", broken)
        response = await h.client.get(OP, headers=h.auth("alice"))
        assert_error(response, 500, "internal")
        assert response.json() == {
            "schema": "sensorium-error.v1",
            "code": "internal",
            "message": "internal error",
        }
        monkeypatch.setattr(h.assembled.service, "invoke", broken)
        assert_error(await h.invoke("alice", scan_directive(1)), 500, "internal")
        monkeypatch.undo()
        # The process keeps serving.
        assert (await h.client.get("/v1/catalog", headers=h.auth("alice"))).status_code == 200
    logged = _server_log(caplog)
    assert "RuntimeError" in logged
    assert CANARY not in logged and "02:00:00:00:00:01" not in logged


def _canary_requests(h: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """Requests that carry the canary in every place a caller controls."""
    alice = h.auth("alice")
    directive = scan_directive(1)
    planted: list[dict[str, Any]] = [
        {**directive, "action_id": CANARY.lower()},
        {**directive, "idempotency_key": CANARY, "timing": {"mode": "async"}},
        {**directive, "correlation/id": CANARY, "input": {**directive["input"], "window_seconds": 0}},
        {**directive, "input": {**directive["input"], "filters": {"name_prefix": CANARY}, CANARY: 1}},
        {**directive, "input": {**directive["input"], "filters": {"service_uuids": [CANARY]}}},
        {**directive, "input": {**directive["input"], "transport": CANARY}},
        {**directive, "causal/context": {"operation/id": 5, CANARY: CANARY}},
        {**directive, "timing": {"mode": "async", "deadline_at": CANARY}},
        command_directive("sensorium.os.info", "sync", {CANARY: CANARY}),
        {CANARY: [CANARY]},
    ]
    requests: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/v1/directives", {"json": body, "headers": alice}) for body in planted
    ]
    requests += [
        ("POST", "/v1/directives", {"json": planted[0], "headers": {"Authorization": f"Bearer {CANARY}"}}),
        ("GET", f"/v1/operations/{CANARY}", {"headers": alice}),
        (
            "GET",
            f"/v1/operations/deferred:{CANARY}:X",
            {"headers": alice, "params": {"wait_seconds": CANARY}},
        ),
        ("POST", f"/v1/operations/{CANARY}/cancel", {"headers": alice}),
        ("POST", f"/v1/operations/{CANARY}/selection", {"headers": alice, "json": {"candidate/ref": CANARY}}),
        ("POST", OP + "/bindings", {"headers": alice, "json": {"candidate/ref": CANARY, CANARY: 1}}),
        ("DELETE", f"/v1/bindings/{CANARY}", {"headers": alice}),
        (
            "POST",
            f"/v1/admin/principals/{CANARY}/revoke",
            {"headers": h.auth("root"), "params": {"action_id": CANARY}},
        ),
        ("GET", f"/{CANARY}", {"headers": {"X-Anything": CANARY}}),
        ("PATCH", "/v1/catalog", {"headers": alice, "content": CANARY.encode()}),
    ]
    return requests


@pytest.mark.asyncio
async def test_no_response_echoes_a_planted_canary(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)  # what `serve` logs at
    factory = RecordingFactory()
    async with harness(tmp_path, factory=factory) as h:
        for method, path, kwargs in _canary_requests(h):
            response: httpx.Response = await h.client.request(method, path, **kwargs)
            assert response.status_code >= 400, (method, path)
            assert_error(response, response.status_code, response.json()["code"])
            assert CANARY.lower() not in response.text.lower(), (method, path, response.text)
            assert all(CANARY.lower() not in v.lower() for v in response.headers.values())
        assert factory.starts == 0 and h.submits == []
    assert CANARY.lower() not in _server_log(caplog).lower()


def _scan_with(raw_number: str, *, where: str) -> bytes:
    """A scan directive whose `where` ("input" or "timing") holds a number exactly as written."""
    directive = scan_directive(1)
    directive[where]["n"] = 0
    return json.dumps(directive).replace('"n": 0', f'"n": {raw_number}').encode()


@pytest.mark.asyncio
async def test_values_strict_json_does_not_carry_are_refused_before_admission(tmp_path: Path) -> None:
    """CONTRACT §1 last paragraph (issue D5): 400 or 422, never a 202 whose statuses cannot be encoded."""
    factory = RecordingFactory()
    async with harness(tmp_path, factory=factory) as h:
        cases = [
            (b'{"schema": "sensorium-directive.v1", "x": Infinity}', 400, "invalid-json"),
            (
                b'{"schema": "sensorium-directive.v1", "schema": "sensorium-directive.v1"}',
                400,
                "invalid-json",
            ),
            (_scan_with('"\\ud800"', where="input"), 400, "invalid-json"),
            (_scan_with("1e400", where="input"), 422, "invalid-input"),
            (_scan_with("9007199254740993", where="input"), 422, "invalid-input"),
            (_scan_with("-9007199254740993", where="input"), 422, "invalid-input"),
            (_scan_with("2.5", where="timing"), 422, "invalid-directive"),
        ]
        for body, status, code in cases:
            response = await h.client.post("/v1/directives", content=body, headers=h.auth("alice"))
            assert_error(response, status, code)
        for path in (OP + "/selection", OP + "/bindings"):
            response = await h.client.post(path, content=b'{"candidate/ref": 1e400}', headers=h.auth("alice"))
            assert_error(response, 422, "invalid-input")
    assert factory.requests == [] and factory.starts == 0


@pytest.mark.asyncio
async def test_any_route_refuses_an_oversized_body_as_documented(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(), max_body_bytes=1024) as h:
        big = b"x" * 4096
        for method, path in (
            ("GET", "/v1/catalog"),
            ("POST", "/v1/operations/x/cancel"),
            ("GET", "/healthz"),
        ):
            response = await h.client.request(method, path, content=big, headers=h.auth("alice"))
            assert_error(response, 413, "body-too-large")  # the OpenAPI check also holds it to the document
