"""Operator routes: durable projections only, history digests, poll-now and cancel, and who may call them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from connector.contract.canonical import sha256_hex
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
from tests.support.directives import command_directive, scan_directive
from tests.support.principals import bearer

pytestmark = pytest.mark.asyncio
ADMIN = "/v1/admin/deferred-operations"
VIEW_KEYS = {
    "operation/id",
    "operation/kind",
    "owner_module_id",
    "capability_id",
    "owner",
    "status",
    "retry_after_seconds",
    "next_poll_at",
    "expires_at",
    "attempts",
    "cancelable",
    "cancel/unavailable-reason",
    "correlation/id",
    "continuation_digest",
    "diagnostics_digest",
    "last_error",
    "created_at",
    "updated_at",
    "bus_op",
    "metadata",
    "route",
    "action",
    "transport",
    "window_seconds",
    "adapter",
    "outcome",
}


def _no_private_parts(document: Any) -> None:
    text = json.dumps(document)
    for key in ('"progress"', '"candidates"', '"candidate/ref"', '"result"', '"snapshot"', '"label"'):
        assert key not in text


async def test_admin_routes_need_an_operator(tmp_path: Path) -> None:
    tokens = add_principals(tmp_path)
    async with host_app(tmp_path, host_poller=False) as (_, client):
        accepted = await client.post(
            "/v1/host/directives", json=scan_directive(), headers=bearer(tokens.alice)
        )
        op_id = accepted.json()["operation/id"]
        calls = [
            ("GET", ADMIN),
            ("GET", f"{ADMIN}/{op_id}"),
            ("POST", f"{ADMIN}/{op_id}/poll"),
            ("POST", f"{ADMIN}/{op_id}/cancel"),
        ]
        for method, path in calls:
            anonymous = await client.request(method, path)
            assert anonymous.status_code == 401 and anonymous.json()["code"] == "unauthenticated"
            caller = await client.request(method, path, headers=bearer(tokens.alice))
            assert caller.status_code == 403 and caller.json()["code"] == "forbidden"
            check("sensorium-error.v1", caller.json())
        unknown = await client.get(
            f"{ADMIN}/deferred:sensorium.directive.invoke:{'Z' * 26}", headers=bearer(tokens.operator)
        )
        assert unknown.status_code == 404 and unknown.json()["code"] == "unknown-operation"


@pytest.mark.realtime  # command subprocesses
async def test_list_and_detail_show_the_durable_projection_and_history_digests(tmp_path: Path) -> None:
    tokens = add_principals(tmp_path)
    async with host_app(tmp_path, host_poller=False) as (assembled, client):
        causal = {"operation/id": "causal:scan-1"}
        scan = await client.post(
            "/v1/host/directives",
            json=scan_directive(1, extra={"causal/context": causal, "correlation/id": "corr-1"}),
            headers=bearer(tokens.alice),
        )
        polls = await poll_until(client, scan.json()["status_href"], tokens.alice, terminal)
        assert polls[-1]["result"]["candidates"]  # the caller did get candidates
        command = await client.post(
            "/v1/host/directives",
            json=command_directive("whisper.redaction.prepare", input={"text": "a@b.example"}),
            headers=bearer(tokens.bob),
        )
        listing = await client.get(ADMIN, headers=bearer(tokens.operator))
        assert listing.status_code == 200
        views = listing.json()["operations"]
        assert {v["operation/id"] for v in views} == {
            scan.json()["operation/id"],
            command.json()["operation/id"],
        }
        assert all(set(v) == VIEW_KEYS for v in views)
        _no_private_parts(listing.json())
        completed = await client.get(ADMIN, params={"status": "completed"}, headers=bearer(tokens.operator))
        assert [v["operation/id"] for v in completed.json()["operations"]] == [scan.json()["operation/id"]]
        bad = await client.get(ADMIN, params={"status": "asleep"}, headers=bearer(tokens.operator))
        assert bad.status_code == 422 and bad.json()["code"] == "invalid-input"
        assert "asleep" not in bad.text
        detail = await client.get(f"{ADMIN}/{scan.json()['operation/id']}", headers=bearer(tokens.operator))
        body = detail.json()
        _no_private_parts(body)
        record = await assembled.registry.get(scan.json()["operation/id"])
        assert record is not None
        assert body["operation"]["metadata"] == dict(record.metadata)
        assert body["operation"]["correlation/id"] == "corr-1" and body["operation"]["owner"] == "alice"
        assert body["history"][0]["seq"] == 1 and body["history"][-1]["status"] == "completed"
        assert body["history"][-1]["digest"] == sha256_hex(dict(record.metadata))
        assert all(set(e) == {"seq", "at", "status", "digest"} for e in body["history"])
        check("execution-receipt.v1", body["receipt"])
        assert body["receipt"]["operation/id"] == "causal:scan-1"
        assert body["receipt"]["deferred_operation/id"] == scan.json()["operation/id"]
        assert body["receipt"]["status"] == "completed"
        command_detail = await client.get(
            f"{ADMIN}/{command.json()['operation/id']}", headers=bearer(tokens.operator)
        )
        assert command_detail.json()["receipt"] is None  # no causal context, no receipt


async def test_poll_now_polls_through_the_connector_and_counts_an_attempt(tmp_path: Path) -> None:
    tokens = add_principals(tmp_path)
    timer = VirtualTimer()
    async with host_app(tmp_path, host_poller=False, timer=timer) as (assembled, client):
        accepted = await client.post(
            "/v1/host/directives", json=scan_directive(1), headers=bearer(tokens.alice)
        )
        ends_ms = timer.now_ms() + 1000  # the scan's 1 s window
        op_id = accepted.json()["operation/id"]
        polled = await client.post(f"{ADMIN}/{op_id}/poll", headers=bearer(tokens.operator))
        assert polled.status_code == 200 and polled.json()["operation"]["attempts"] == 1
        while polled.json()["operation"]["status"] != "completed":
            await next_due(timer, by_ms=ends_ms + 1000)
            polled = await client.post(f"{ADMIN}/{op_id}/poll", headers=bearer(tokens.operator))
        _no_private_parts(polled.json())
        assert (
            polled.json()["operation"]["metadata"]["disclosed_count"] == 0
        )  # the operator saw no candidates
        # Every poll-now of the live operation was one host poll and one attempt, and none after it ended.
        attempts = polled.json()["operation"]["attempts"]
        assert assembled.host.metrics.count("sensorium_host_polls") == attempts >= 1
        done = await client.post(f"{ADMIN}/{op_id}/poll", headers=bearer(tokens.operator))
        assert done.json()["operation"]["attempts"] == attempts  # terminal: no poll
        assert assembled.host.metrics.count("sensorium_host_polls") == attempts


@pytest.mark.realtime  # command subprocesses
async def test_operator_cancel_is_bridged_where_cancelable(tmp_path: Path) -> None:
    tokens = add_principals(tmp_path, ("test.stubborn",))
    catalog, _ = signed_catalog(tmp_path / "catalog", tmp_path / "marker")
    async with host_app(tmp_path, host_poller=False, catalog=catalog) as (assembled, client):
        scan = await client.post("/v1/host/directives", json=scan_directive(30), headers=bearer(tokens.alice))
        op_id = scan.json()["operation/id"]
        await poll_until(client, scan.json()["status_href"], tokens.alice, lambda b: b["status"] == "running")
        cancelled = await client.post(f"{ADMIN}/{op_id}/cancel", headers=bearer(tokens.operator))
        assert cancelled.status_code == 200
        _no_private_parts(cancelled.json())
        assert cancelled.json()["operation"]["metadata"]["cancellation"]["state"] in (
            "requested",
            "confirmed",
        )
        with anyio.fail_after(10):
            while (await client.post(f"{ADMIN}/{op_id}/poll", headers=bearer(tokens.operator))).json()[
                "operation"
            ]["status"] != "cancelled":
                await anyio.sleep(0.05)  # real peer: the stubborn command is a subprocess: real time
        terminal_again = await client.post(f"{ADMIN}/{op_id}/cancel", headers=bearer(tokens.operator))
        assert (
            terminal_again.status_code == 200 and terminal_again.json()["operation"]["status"] == "cancelled"
        )
        stubborn = await client.post(
            "/v1/host/directives", json=command_directive("test.stubborn"), headers=bearer(tokens.alice)
        )
        refused = await client.post(
            f"{ADMIN}/{stubborn.json()['operation/id']}/cancel", headers=bearer(tokens.operator)
        )
        assert refused.status_code == 409 and refused.json()["code"] == "not-cancelable"
        assert (await status_of(assembled.commands, stubborn.json()["operation/id"]))["status"] in (
            "pending",
            "running",
        )
