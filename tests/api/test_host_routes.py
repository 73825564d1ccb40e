"""The host's caller routes over a real connector: live v2 status, authority, unknown, size limit, cancel."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from connector.core.clock import parse_time
from connector.core.policy import DeferredHostPolicy
from connector.storage.principals import revoke
from connector.timer import VirtualTimer
from tests.host.support import (
    add_principals,
    check,
    host_app,
    next_due,
    poll_until,
    signed_catalog,
    terminal,
)
from tests.runtime.commands.conftest import status_of
from tests.runtime.sessions import until_terminal
from tests.support.directives import command_directive, scan_directive
from tests.support.principals import bearer

pytestmark = pytest.mark.asyncio
NEVER_SEEN = "deferred:sensorium.directive.invoke:" + "Q" * 26


def _candidates(document: dict[str, Any]) -> list[dict[str, Any]]:
    progress = document.get("progress") or {}
    return list((progress.get("snapshot") or {}).get("candidates", []))


async def test_the_owner_reads_the_live_v2_status_with_the_hosts_policy_fields(tmp_path: Path) -> None:
    tokens = add_principals(tmp_path)
    async with host_app(tmp_path, host_poller=False) as (assembled, client):
        accepted = await client.post(
            "/v1/host/directives", json=scan_directive(2), headers=bearer(tokens.alice)
        )
        assert accepted.status_code == 202
        handle = accepted.json()
        check("deferred-operation.v1", handle)
        assert accepted.headers["location"] == handle["status_href"]
        op_id = handle["operation/id"]
        woke = await client.get(
            f"{handle['status_href']}?wait_seconds=10&after_revision=0", headers=bearer(tokens.alice)
        )
        assert (
            woke.status_code == 200 and woke.json()["progress"]["revision"] >= 1
        )  # long poll passes through
        polls = [woke.json(), *await poll_until(client, handle["status_href"], tokens.alice, terminal)]
        check("deferred-operation-status.v2", polls)
        assert all(p["expires_at"] == handle["expires_at"] for p in polls)
        assert all(1 <= p["retry_after_seconds"] <= 60 for p in polls if not terminal(p))
        final = polls[-1]
        assert final["status"] == "completed" and final["cleanup"] == {
            "state": "confirmed",
            "claim": "released",
        }
        assert final["result"]["candidates"] and final["result"]["candidates"] == _candidates(final)
        delivered = {c["candidate/ref"] for p in polls for c in _candidates(p)}
        record = await assembled.registry.get(op_id)
        assert record is not None and record.status == "completed"
        assert record.metadata["disclosed_count"] == len(delivered)
        stored = json.dumps(dict(record.metadata)) + json.dumps(dict(record.handle))
        assert not any(ref in stored for ref in delivered)


async def test_only_the_owner_with_a_current_grant_sees_the_operation(tmp_path: Path) -> None:
    tokens = add_principals(tmp_path)
    timer = VirtualTimer()
    async with host_app(tmp_path, host_poller=False, timer=timer) as (assembled, client):
        accepted = await client.post(
            "/v1/host/directives", json=scan_directive(30), headers=bearer(tokens.alice)
        )
        path = accepted.json()["status_href"]
        op_id = accepted.json()["operation/id"]
        never = await client.get(f"/v1/host/operations/{NEVER_SEEN}", headers=bearer(tokens.bob))
        assert never.status_code == 404 and never.json()["code"] == "unknown-operation"
        for token in (tokens.bob, tokens.operator):
            other = await client.get(path, headers=bearer(token))
            assert (other.status_code, other.content) == (404, never.content)  # no existence leak
            cancel = await client.post(f"{path}/cancel", headers=bearer(token))
            assert (cancel.status_code, cancel.content) == (404, never.content)
        missing = await client.get(path)
        assert missing.status_code == 401 and missing.json()["code"] == "unauthenticated"
        revoke(tmp_path, "alice", "device.discovery.scan")
        revoked = await client.get(path, headers=bearer(tokens.alice))
        assert (revoked.status_code, revoked.content) == (404, never.content)
        record = await assembled.registry.get(op_id)
        assert record is not None and record.status != "unknown"  # a lost grant is not a lost operation
        # Host-owned cleanup ends the scan (well inside its 30 s window); the poller records it as such.
        revoked_at_ms = timer.now_ms()
        while (record := await assembled.host.poll(record)).status == "running":
            await next_due(timer, by_ms=revoked_at_ms + 10_000)
        assert record.status == "failed" and record.metadata["error_code"] == "grant-revoked"


@pytest.mark.realtime  # command subprocesses
async def test_an_operation_the_connector_forgot_becomes_unknown(tmp_path: Path) -> None:
    tokens = add_principals(tmp_path)
    async with host_app(tmp_path, host_poller=False) as (assembled, client):
        directive = command_directive("whisper.redaction.prepare", input={"text": "call +48 601 234 567"})
        accepted = await client.post("/v1/host/directives", json=directive, headers=bearer(tokens.alice))
        op_id = accepted.json()["operation/id"]
        done = await status_of(assembled.commands, op_id, 15)
        assert done["status"] == "completed"
        # Purge as of a moment after the row's own last update (recorded state, not the wall clock, which
        # can still read the same millisecond as that update).
        after_update = parse_time(done["updated_at"]) + timedelta(seconds=1)
        assert await assembled.commands.purge(after_update, retention=timedelta(0))
        answer = await client.get(accepted.json()["status_href"], headers=bearer(tokens.alice))
        assert answer.status_code == 200
        body = answer.json()
        check("deferred-operation-status.v1", body)
        assert body["status"] == "unknown" and "retry_after_seconds" not in body
        assert body["diagnostics"][0]["code"] == "unknown-operation"
        record = await assembled.registry.get(op_id)
        assert record is not None and record.status == "unknown" and record.next_poll_at is None
        again = await client.get(accepted.json()["status_href"], headers=bearer(tokens.alice))
        assert again.json()["status"] == "unknown"  # terminal: it stays unknown


async def test_a_discovery_status_over_the_size_limit_ends_failed(tmp_path: Path) -> None:
    tokens = add_principals(tmp_path)
    policy = DeferredHostPolicy(max_response_bytes=1500)
    async with host_app(tmp_path, host_poller=False, host_policy=policy) as (assembled, client):
        accepted = await client.post(
            "/v1/host/directives", json=scan_directive(3), headers=bearer(tokens.alice)
        )
        op_id = accepted.json()["operation/id"]
        polls = await poll_until(client, accepted.json()["status_href"], tokens.alice, terminal)
        check("deferred-operation-status.v2", polls)
        assert all(len(json.dumps(p)) <= 1500 for p in polls)
        final = polls[-1]
        assert final["status"] == "failed" and final["error"]["code"] == "response-too-large"
        assert "progress" not in final
        connector = await until_terminal(assembled.discovery, op_id)  # the session was terminated
        assert connector["status"] == "failed" and connector["error"]["code"] == "response-too-large"
        assert connector["cleanup"]["state"] == "confirmed"


@pytest.mark.realtime  # command subprocesses
async def test_a_command_status_over_the_size_limit_ends_failed(tmp_path: Path) -> None:
    tokens = add_principals(tmp_path, ("test.flood",))
    catalog, _ = signed_catalog(tmp_path / "catalog", tmp_path / "marker")
    policy = DeferredHostPolicy(max_response_bytes=2000)
    async with host_app(tmp_path, host_poller=False, host_policy=policy, catalog=catalog) as (
        assembled,
        client,
    ):
        accepted = await client.post(
            "/v1/host/directives", json=command_directive("test.flood"), headers=bearer(tokens.alice)
        )
        op_id = accepted.json()["operation/id"]
        assert (await status_of(assembled.commands, op_id, 15))["status"] == "completed"
        answer = await client.get(accepted.json()["status_href"], headers=bearer(tokens.alice))
        body = answer.json()
        check("deferred-operation-status.v1", body)
        assert body["status"] == "failed" and body["error"]["code"] == "response-too-large"
        record = await assembled.registry.get(op_id)
        assert record is not None and record.last_error == "response-too-large"
        assert "result" not in record.metadata


async def test_cancel_is_bridged_for_a_scan_through_requested_to_cancelled(tmp_path: Path) -> None:
    tokens = add_principals(tmp_path)
    async with host_app(tmp_path, host_poller=False) as (assembled, client):
        accepted = await client.post(
            "/v1/host/directives", json=scan_directive(30), headers=bearer(tokens.alice)
        )
        path = accepted.json()["status_href"]
        first = await poll_until(client, path, tokens.alice, lambda b: b["status"] == "running")
        cancelled = await client.post(accepted.json()["cancel_href"], headers=bearer(tokens.alice))
        assert cancelled.status_code == 200
        answer = cancelled.json()
        assert answer["cancellation"]["state"] in ("requested", "confirmed") and "progress" not in answer
        polls = [*first, answer, *await poll_until(client, path, tokens.alice, terminal)]
        check("deferred-operation-status.v2", polls)
        assert polls[-1]["status"] == "cancelled" and polls[-1]["cancellation"]["state"] == "confirmed"
        again = await client.post(accepted.json()["cancel_href"], headers=bearer(tokens.alice))
        assert again.status_code == 200 and again.json()["status"] == "cancelled"  # terminal: unchanged
        record = await assembled.registry.get(accepted.json()["operation/id"])
        assert record is not None and record.status == "cancelled"


@pytest.mark.realtime  # command subprocesses
async def test_cancel_of_commands_is_bridged_only_where_a_cancel_href_exists(tmp_path: Path) -> None:
    tokens = add_principals(tmp_path, ("test.slow", "test.stubborn"))
    catalog, _ = signed_catalog(tmp_path / "catalog", tmp_path / "marker")
    async with host_app(tmp_path, host_poller=False, catalog=catalog) as (assembled, client):
        stubborn = await client.post(
            "/v1/host/directives", json=command_directive("test.stubborn"), headers=bearer(tokens.alice)
        )
        handle = stubborn.json()
        check("deferred-operation.v1", handle)
        assert "cancel_href" not in handle and handle["cancel/unavailable-reason"]
        refused = await client.post(f"{handle['status_href']}/cancel", headers=bearer(tokens.alice))
        assert refused.status_code == 409 and refused.json()["code"] == "not-cancelable"
        assert refused.json()["message"] == handle["cancel/unavailable-reason"]
        still = await status_of(assembled.commands, handle["operation/id"])
        assert still["status"] in ("pending", "running")
        slow = await client.post(
            "/v1/host/directives", json=command_directive("test.slow"), headers=bearer(tokens.alice)
        )
        with anyio.fail_after(10):
            while (await status_of(assembled.commands, slow.json()["operation/id"]))["status"] != "running":
                await anyio.sleep(0.05)  # real peer: the command subprocess starts
        cancelled = await client.post(slow.json()["cancel_href"], headers=bearer(tokens.alice))
        assert cancelled.status_code == 200
        check("deferred-operation-status.v1", cancelled.json())
        assert cancelled.json()["status"] == "cancelled"


async def test_sync_work_and_refusals_pass_through_the_host(tmp_path: Path) -> None:
    tokens = add_principals(tmp_path)
    async with host_app(tmp_path, host_poller=False) as (assembled, client):
        sync = await client.post(
            "/v1/host/directives",
            json=command_directive("sensorium.os.info", "sync"),
            headers=bearer(tokens.alice),
        )
        assert sync.status_code == 200
        check("sensorium-directive-result.v1", sync.json())
        wrong_mode = await client.post(
            "/v1/host/directives", json=command_directive("sensorium.os.info"), headers=bearer(tokens.alice)
        )
        assert wrong_mode.status_code == 409 and wrong_mode.json()["code"] == "execution-mode-not-supported"
        not_json = await client.post("/v1/host/directives", content=b"{nope", headers=bearer(tokens.alice))
        assert not_json.status_code == 400 and not_json.json()["code"] == "invalid-json"
        no_token = await client.post("/v1/host/directives", json=scan_directive())
        assert no_token.status_code == 401
        assert await assembled.registry.list() == []


async def test_an_idempotent_repeat_through_the_host_joins_the_same_work(tmp_path: Path) -> None:
    tokens = add_principals(tmp_path)
    timer = VirtualTimer()
    async with host_app(tmp_path, host_poller=False, timer=timer) as (assembled, client):
        directive = scan_directive(5, key="key-1")
        first = await client.post("/v1/host/directives", json=directive, headers=bearer(tokens.alice))
        await timer.advance(0)  # every task blocked: the first admission has reached the runtime
        second = await client.post(
            "/v1/host/directives", json={**directive, "correlation/id": "other"}, headers=bearer(tokens.alice)
        )
        assert (first.status_code, first.content) == (second.status_code, second.content)
        assert first.headers["retry-after"] == second.headers["retry-after"]
        assert len(list(assembled.discovery.operation_ids())) == 1
        assert len(await assembled.registry.list()) == 1
        conflict = await client.post(
            "/v1/host/directives",
            json=scan_directive(6, key="key-1"),
            headers=bearer(tokens.alice),
        )
        assert conflict.status_code == 409 and conflict.json()["code"] == "idempotency-conflict"


async def test_the_host_authenticates_before_it_parses(tmp_path: Path) -> None:
    """Issue D7: without a token a malformed body answers 401, not 400."""
    tokens = add_principals(tmp_path)
    async with host_app(tmp_path, host_poller=False) as (assembled, client):
        for body in (b"{nope", b'{"x": NaN}', b'{"input": {"n": 1e400}}'):
            anonymous = await client.post("/v1/host/directives", content=body)
            assert anonymous.status_code == 401 and anonymous.json()["code"] == "unauthenticated"
            wrong = await client.post("/v1/host/directives", content=body, headers=bearer("not-a-token"))
            assert wrong.status_code == 401
        refusals = [
            (b'{"x": NaN}', 400, "invalid-json"),
            (b'{"a": 1, "a": 1}', 400, "invalid-json"),
            (b'{"a": "\\udc00"}', 400, "invalid-json"),
            (
                json.dumps(scan_directive())
                .replace('"window_seconds": 1', '"window_seconds": 1e400')
                .encode(),
                422,
                "invalid-input",
            ),
            (
                json.dumps(scan_directive())
                .replace('"window_seconds": 1', '"window_seconds": 9007199254740993')
                .encode(),
                422,
                "invalid-input",
            ),
        ]
        for body, status, code in refusals:
            refused = await client.post("/v1/host/directives", content=body, headers=bearer(tokens.alice))
            assert (refused.status_code, refused.json()["code"]) == (status, code)
        assert await assembled.registry.list() == []
        assert list(assembled.discovery.operation_ids()) == []
