"""CONTRACT §2: admission steps in order, each refusal with its exact code and status, and always before any
provider call or process spawn; an earlier failing step wins over a later one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from connector.core.policy import DeferredHostPolicy
from connector.errors import SensoriumError
from connector.service.answers import Accepted
from providers import replay
from tests.api.support import (
    CANARY,
    HEART_RATE_LAB,
    INFO,
    REDACT,
    Harness,
    RecordingFactory,
    assert_error,
    harness,
    straps,
)
from tests.support.directives import command_directive, scan_directive
from tests.support.waiting import wait_until


def _without(doc: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in keys}


def _timing(doc: dict[str, Any], **timing: Any) -> dict[str, Any]:
    return {**doc, "timing": timing}


def _input(doc: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**doc, "input": {**doc["input"], **changes}}


SCAN_OK = scan_directive(5)
STEP_REFUSALS: list[tuple[str, str | None, dict[str, Any] | Any, int, str]] = [
    # step 1: authentication
    ("no token", None, SCAN_OK, 401, "unauthenticated"),
    ("unknown token", CANARY, SCAN_OK, 401, "unauthenticated"),
    # step 2: the directive's schema
    ("missing timing", "alice", _without(SCAN_OK, "timing"), 422, "invalid-directive"),
    ("unknown top-level key", "alice", {**SCAN_OK, CANARY: CANARY}, 422, "invalid-directive"),
    ("bad mode", "alice", _timing(SCAN_OK, mode=CANARY, status_versions=[2]), 422, "invalid-directive"),
    ("not an object", "alice", [SCAN_OK], 422, "invalid-directive"),
    # step 3: the catalog
    ("unknown action", "alice", {**SCAN_OK, "action_id": "no.such.action"}, 404, "unknown-action"),
    # step 4: execution mode
    (
        "async-only as sync",
        "alice",
        _timing(SCAN_OK, mode="sync", status_versions=[2]),
        409,
        "execution-mode-not-supported",
    ),
    ("sync-only as async", "alice", command_directive(INFO, "async"), 409, "execution-mode-not-supported"),
    # step 5: grant for the action and scope
    ("grant narrowed to mdns", "carol", SCAN_OK, 403, "forbidden"),
    ("no grant for the action", "carol", command_directive(INFO, "sync"), 403, "forbidden"),
    ("operator holds no grants", "root", SCAN_OK, 403, "forbidden"),
    # step 6: the action's input rules
    ("window zero", "alice", _input(SCAN_OK, window_seconds=0), 422, "invalid-input"),
    ("window above profile", "alice", _input(SCAN_OK, window_seconds=61), 422, "invalid-input"),
    ("unknown input key", "alice", _input(SCAN_OK, **{CANARY: CANARY}), 422, "invalid-input"),
    ("no filter", "alice", _input(SCAN_OK, filters={}), 422, "invalid-input"),
    (
        "window longer than timeout_ms",
        "alice",
        _timing(SCAN_OK, mode="async", status_versions=[2], timeout_ms=4000),
        422,
        "invalid-input",
    ),
    (
        "command input not allowed",
        "alice",
        command_directive(INFO, "sync", {"x": CANARY}),
        422,
        "invalid-input",
    ),
    # step 7: status v2
    (
        "status v1 only",
        "alice",
        _timing(SCAN_OK, mode="async", status_versions=[1]),
        409,
        "status-v2-required",
    ),
    ("status versions absent", "alice", _timing(SCAN_OK, mode="async"), 409, "status-v2-required"),
]


def _assert_untouched(h: Harness, factory: RecordingFactory) -> None:
    """No provider was built or started and no command was submitted or stored."""
    assert factory.requests == [] and factory.starts == 0
    assert h.submits == [] and h.command_rows() == []


@pytest.mark.asyncio
async def test_each_step_refuses_with_its_code_before_any_io(tmp_path: Path) -> None:
    factory = RecordingFactory(straps(2))
    async with harness(tmp_path, factory=factory) as h:
        for name, who, directive, status, code in STEP_REFUSALS:
            response = await h.invoke(who, directive)
            body = assert_error(response, status, code)
            assert CANARY not in response.text, name
            assert "retry-after" not in response.headers, name
            if code in ("invalid-directive", "invalid-input"):
                # Paths and rule names only: every message is "<json pointer>: <rule>".
                assert body["diagnostics"], name
                assert all(d["message"].startswith("/") for d in body["diagnostics"]), name
            _assert_untouched(h, factory)


@pytest.mark.asyncio
async def test_window_longer_than_timeout_names_the_rule(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory()) as h:
        directive = _timing(SCAN_OK, mode="async", status_versions=[2], timeout_ms=4999)
        body = assert_error(await h.invoke("alice", directive), 422, "invalid-input")
        assert {"code": "invalid-input", "message": "/input/window_seconds: window-exceeds-timeout"} in body[
            "diagnostics"
        ]
        accepted = await h.invoke(
            "alice", _timing(SCAN_OK, mode="async", status_versions=[2], timeout_ms=5000)
        )
        assert accepted.status_code == 202


@pytest.mark.asyncio
async def test_too_many_operations_refuses_before_the_provider(tmp_path: Path) -> None:
    factory = RecordingFactory(straps(1), concurrent=True)
    async with harness(tmp_path, factory=factory) as h:
        h.assembled.service.policy = DeferredHostPolicy(max_operations_per_principal=1)
        assert (await h.invoke("alice", scan_directive(10))).status_code == 202
        await wait_until(lambda: factory.starts == 1)
        for directive in (scan_directive(10), command_directive(REDACT, "async", {"text": CANARY})):
            response = await h.invoke("alice", directive)
            assert_error(response, 429, "too-many-operations")
            assert CANARY not in response.text
        assert (len(factory.requests), factory.starts) == (1, 1)
        assert h.submits == [] and h.command_rows() == []
        # The limit is per principal: bob is not affected.
        assert (await h.invoke("bob", scan_directive(10))).status_code == 202


@pytest.mark.asyncio
async def test_a_causal_context_over_4_kib_is_refused_naming_the_path(tmp_path: Path) -> None:
    factory = RecordingFactory(straps(1), concurrent=True)
    context = {"operation/id": "op:flow-1", "note": CANARY * 500}
    directive = scan_directive(1, extra={"causal/context": context})
    async with harness(tmp_path, factory=factory) as h:
        refused = await h.invoke("alice", directive)
        body = assert_error(refused, 422, "invalid-directive")
        assert body["diagnostics"] == [
            {"code": "invalid-directive", "message": "/causal~1context: causal-context-size"}
        ]
        assert CANARY not in refused.text and factory.requests == []
        with pytest.raises(SensoriumError) as by_host:
            await h.assembled.host.admit(h.assembled.host.authenticate(h.tokens["alice"]), directive)
        assert by_host.value.code == "invalid-directive"
        context["note"] = "n" * (4096 - len('{"note":"","operation/id":"op:flow-1"}'))  # exactly 4 KiB
        assert (await h.invoke("alice", directive)).status_code == 202


@pytest.mark.asyncio
async def test_live_sessions_are_capped_per_transport_across_principals_and_routes(tmp_path: Path) -> None:
    factory = RecordingFactory(straps(1), concurrent=True)
    async with harness(tmp_path, factory=factory) as h:
        h.assembled.service.policy = DeferredHostPolicy(max_live_sessions=2)
        first = await h.invoke("alice", scan_directive(30))
        assert first.status_code == 202
        hosted = await h.assembled.host.admit(
            h.assembled.host.authenticate(h.tokens["bob"]), scan_directive(30)
        )  # the host route and Bus
        assert isinstance(hosted, Accepted)
        await wait_until(lambda: factory.starts == 2)
        refused = await h.invoke("alice", scan_directive(30))
        assert_error(refused, 429, "too-many-operations")
        assert refused.headers["retry-after"] == "1"
        with pytest.raises(SensoriumError) as by_host:
            await h.assembled.host.admit(h.assembled.host.authenticate(h.tokens["bob"]), scan_directive(30))
        assert (by_host.value.code, by_host.value.retry_after_seconds) == ("too-many-operations", 1)
        assert factory.starts == 2 and len(factory.requests) == 2  # refused before any provider
        # The cap is per transport: another transport still has room.
        assert (await h.invoke("carol", scan_directive(1, transport="mdns"))).status_code == 202
        # An ended session leaves the count.
        await h.post("alice", first.headers["location"] + "/cancel")
        await h.poll("alice", first.headers["location"])
        assert (await h.invoke("bob", scan_directive(1))).status_code == 202


@pytest.mark.asyncio
async def test_transport_claimed_refuses_without_starting_the_provider(tmp_path: Path) -> None:
    factory = RecordingFactory(straps(1), concurrent=False)
    async with harness(tmp_path, factory=factory) as h:
        first = await h.invoke("alice", scan_directive(5))
        assert first.status_code == 202
        refused = await h.invoke("bob", scan_directive(3))
        body = assert_error(refused, 409, "transport-claimed")
        # The holder's window (5 s) plus its cleanup budget (the shipped 4 s) is what the refusal asks for.
        assert 1 <= body["retry_after_seconds"] <= 9
        await wait_until(lambda: factory.starts == 1)
        # Another transport is another claim.
        assert (await h.invoke("bob", scan_directive(1, transport="mdns"))).status_code == 202
        await wait_until(lambda: factory.starts == 2)


@pytest.mark.asyncio
async def test_command_refusals_spawn_no_process(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory()) as h:
        cases = [
            (None, command_directive(INFO, "sync"), 401, "unauthenticated"),
            ("alice", command_directive(INFO, "sync", extra={"unexpected": 1}), 422, "invalid-directive"),
            ("alice", command_directive(INFO, "async"), 409, "execution-mode-not-supported"),
            ("carol", command_directive(REDACT, "sync", {"text": "x"}), 403, "forbidden"),
            ("alice", command_directive(INFO, "sync", {"unexpected": True}), 422, "invalid-input"),
        ]
        for who, directive, status, code in cases:
            assert_error(await h.invoke(who, directive), status, code)
        assert h.submits == [] and h.command_rows() == []
        ran = await h.invoke("alice", command_directive(INFO, "sync"))
        assert ran.status_code == 200 and len(h.submits) == 1


EARLIER_WINS: list[tuple[str, str | None, Any, int, str]] = [
    ("no token and not JSON", None, b"{" + CANARY.encode(), 401, "unauthenticated"),
    ("no token and a bad directive", None, {"schema": CANARY}, 401, "unauthenticated"),
    (
        "bad directive and unknown action",
        "alice",
        {"schema": "sensorium-directive.v1", "action_id": "nope", "timing": {"mode": "x"}, "input": {}},
        422,
        "invalid-directive",
    ),
    (
        "unknown action before mode",
        "alice",
        {**_timing(SCAN_OK, mode="sync"), "action_id": "nope"},
        404,
        "unknown-action",
    ),
    (
        "mode before grant",
        "carol",
        _timing(SCAN_OK, mode="sync", status_versions=[2]),
        409,
        "execution-mode-not-supported",
    ),
    ("grant before input", "carol", _input(SCAN_OK, window_seconds=0), 403, "forbidden"),
    (
        "input before status v2",
        "alice",
        _input(_timing(SCAN_OK, mode="async"), window_seconds=0),
        422,
        "invalid-input",
    ),
]


@pytest.mark.asyncio
async def test_an_earlier_failing_step_wins(tmp_path: Path) -> None:
    factory = RecordingFactory()
    async with harness(tmp_path, factory=factory) as h:
        for name, who, body, status, code in EARLIER_WINS:
            headers = h.auth(who) if who else {}
            if isinstance(body, bytes):
                response = await h.client.post("/v1/directives", content=body, headers=headers)
            else:
                response = await h.invoke(who, body)
            assert (response.status_code, response.json()["code"]) == (status, code), name
            assert CANARY not in response.text
        _assert_untouched(h, factory)


@pytest.mark.asyncio
async def test_later_steps_after_earlier_ones(tmp_path: Path) -> None:
    """Status v2 before idempotency; idempotency (replay or conflict) before concurrency and claims."""
    factory = RecordingFactory(straps(1), concurrent=False)
    async with harness(tmp_path, factory=factory) as h:
        first = await h.invoke("alice", scan_directive(5, key="k"))
        assert first.status_code == 202
        await wait_until(lambda: factory.starts == 1)
        v1_only = _timing(scan_directive(5, key="k"), mode="async", status_versions=[1])
        assert_error(await h.invoke("alice", v1_only), 409, "status-v2-required")
        h.assembled.service.policy = DeferredHostPolicy(max_operations_per_principal=1)
        # The claim is held and the principal is at its limit, yet the repeat answers as the first time ...
        replay = await h.invoke("alice", scan_directive(5, key="k"))
        assert (replay.status_code, replay.content) == (202, first.content)
        # ... and a different directive under the same key is a conflict, not a 429 or a claim refusal.
        assert_error(await h.invoke("alice", scan_directive(4, key="k")), 409, "idempotency-conflict")
        # Without a key: the limit comes before the claim.
        assert_error(await h.invoke("alice", scan_directive(4)), 429, "too-many-operations")
        assert factory.starts == 1 and len(factory.requests) == 1


@pytest.mark.asyncio
async def test_status_versions_with_2_are_admitted(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(concurrent=True)) as h:
        for versions in ([2], [1, 2], [2, 1]):
            response = await h.invoke("alice", _timing(SCAN_OK, mode="async", status_versions=versions))
            assert response.status_code == 202, versions


def test_refusal_table_covers_every_step() -> None:
    codes = {code for *_, code in STEP_REFUSALS}
    assert codes == {
        "unauthenticated",
        "invalid-directive",
        "unknown-action",
        "execution-mode-not-supported",
        "forbidden",
        "invalid-input",
        "status-v2-required",
    }


@pytest.mark.asyncio
async def test_a_replay_fixture_is_parsed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Admission must not re-read the fixture: parsing runs on the event loop and stalls every request."""
    loads: list[object] = []
    original = replay.load_fixture

    def counting(path: Path | str) -> replay.Fixture:
        loads.append(path)
        return original(path)

    monkeypatch.setattr(replay, "load_fixture", counting)
    async with harness(tmp_path, replay={"ble": HEART_RATE_LAB}) as h:
        for _ in range(3):
            assert (await h.invoke("alice", scan_directive(1))).status_code == 202
    assert len(loads) <= 1
