"""Restart: open scans end failed (interrupted-by-restart), command ends are mirrored, nothing restarts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from connector.assembly import ConnectorConfig, provider_factory
from connector.host.continuations import Resumption
from providers.base import Provider
from tests.host.support import add_principals, check, host_app, poll_until, signed_catalog
from tests.runtime.commands.conftest import status_of
from tests.support.directives import command_directive, scan_directive
from tests.support.principals import bearer

pytestmark = pytest.mark.asyncio


def counting(starts: list[str]) -> Callable[[ConnectorConfig], Callable[[str, str | None], Provider]]:
    """A provider factory that records every provider it builds (one per admitted scan)."""

    def factory(config: ConnectorConfig) -> Callable[[str, str | None], Provider]:
        base = provider_factory(config)

        def build(transport: str, adapter: str | None) -> Provider:
            starts.append(transport)
            return base(transport, adapter)

        return build

    return factory


def flow_continuation() -> dict[str, Any]:
    return {
        "schema": "orbiplex-continuation.v1",
        "continuation_id": "continuation:restart-1",
        "resume_kind": "json_e_flow_step",
        "resume_point": {"executor_id": "json_e_flow", "output_binding": "redacted"},
        "caller": {"module_id": "test.flow"},
        "capability_id": "sensorium.directive.invoke",
        "deadline_at": "2099-01-01T00:00:00Z",
        "attempts": 1,
    }


@pytest.mark.realtime  # command subprocesses
async def test_a_restart_interrupts_discovery_mirrors_commands_and_restarts_nothing(tmp_path: Path) -> None:
    tokens = add_principals(tmp_path, ("test.slow",))
    catalog, _ = signed_catalog(tmp_path / "catalog", tmp_path / "marker")
    starts: list[str] = []
    settings: dict[str, Any] = {"host_poller": False, "catalog": catalog, "providers": counting(starts)}
    async with host_app(tmp_path, **settings) as (assembled, client):
        scan = (
            await client.post("/v1/host/directives", json=scan_directive(30), headers=bearer(tokens.alice))
        ).json()
        await poll_until(client, scan["status_href"], tokens.alice, lambda b: b["status"] == "running")
        slow = (
            await client.post(
                "/v1/host/directives", json=command_directive("test.slow"), headers=bearer(tokens.alice)
            )
        ).json()
        directive = command_directive("whisper.redaction.prepare", input={"text": "write to a@b.example"})
        quick = (
            await client.post("/v1/host/directives", json=directive, headers=bearer(tokens.alice))
        ).json()
        await assembled.host.continuations.suspend(
            quick["operation/id"], {**flow_continuation(), "deferred_operation_id": quick["operation/id"]}
        )
        with anyio.fail_after(15):
            while (await status_of(assembled.commands, slow["operation/id"]))["status"] != "running":
                await anyio.sleep(0.05)  # real peer: the command subprocess starts
        assert (await status_of(assembled.commands, quick["operation/id"], 15))["status"] == "completed"
        quick_row = await assembled.registry.get(quick["operation/id"])
        assert quick_row is not None and quick_row.status in (
            "pending",
            "running",
        )  # the host has not seen it
    assert starts == ["ble"]

    resumed: list[Resumption] = []
    async with host_app(tmp_path, **settings) as (assembled, client):
        assert assembled.readiness.interrupted_marked and (await client.get("/healthz")).status_code == 200
        ended = {r.operation_id: r for r in assembled.host.interrupted}
        assert set(ended) == {scan["operation/id"], slow["operation/id"]}
        assert all(r.status == "failed" and r.last_error == "interrupted-by-restart" for r in ended.values())
        scan_status = (await client.get(scan["status_href"], headers=bearer(tokens.alice))).json()
        check("deferred-operation-status.v2", scan_status)
        assert scan_status["status"] == "failed" and scan_status["error"]["code"] == "interrupted-by-restart"
        assert "progress" not in scan_status and "result" not in scan_status
        slow_status = (await client.get(slow["status_href"], headers=bearer(tokens.alice))).json()
        check("deferred-operation-status.v1", slow_status)
        assert slow_status["status"] == "failed" and slow_status["error"]["code"] == "interrupted-by-restart"
        quick_status = (await client.get(quick["status_href"], headers=bearer(tokens.alice))).json()
        assert (
            quick_status["status"] == "completed"
            and quick_status["result"]["json"]["redactions"]["email"] == 1
        )
        # The flow waiting on the command resumes once the runtime installs its hook, with the live result.
        await assembled.host.continuations.install(resumed.append)
        await assembled.host.continuations.install(resumed.append)
        assert assembled.host.metrics.count("sensorium_host_terminal_outcomes", label="failed") == 2
        assert list(assembled.discovery.operation_ids()) == []  # no candidates, no session rebuilt
    assert starts == ["ble"]  # no scan restarted by itself
    assert len(resumed) == 1 and resumed[0].resumed
    assert resumed[0].continuation["context"]["redacted"]["json"]["text"] == "write to [email]"


async def test_a_keyed_repeat_after_a_restart_answers_the_interrupted_handle_and_starts_nothing(
    tmp_path: Path,
) -> None:
    tokens = add_principals(tmp_path, ())
    starts: list[str] = []
    settings: dict[str, Any] = {"host_poller": False, "providers": counting(starts)}
    keyed = {**scan_directive(30), "idempotency_key": "bench-run-7"}
    async with host_app(tmp_path, **settings) as (_, client):
        first = await client.post("/v1/host/directives", json=keyed, headers=bearer(tokens.alice))
        assert first.status_code == 202
        await poll_until(
            client, first.json()["status_href"], tokens.alice, lambda b: b["status"] == "running"
        )
    assert starts == ["ble"]
    async with host_app(tmp_path, **settings) as (_, client):
        again = await client.post("/v1/host/directives", json=keyed, headers=bearer(tokens.alice))
        assert again.status_code == 202
        assert again.content == first.content
        status = (await client.get(again.json()["status_href"], headers=bearer(tokens.alice))).json()
        assert status["status"] == "failed"
        assert status["error"]["code"] == "interrupted-by-restart"
    assert starts == ["ble"]  # no second, untracked session under the same id


async def test_a_keyed_repeat_of_ended_work_is_admitted_like_a_first_one(tmp_path: Path) -> None:
    """Issue D6: steps 2-8 run on every repeat, before and after a restart; only step 9 is skipped."""
    tokens = add_principals(tmp_path, ())
    starts: list[str] = []
    settings: dict[str, Any] = {"host_poller": False, "providers": counting(starts)}
    keyed = {**scan_directive(1), "idempotency_key": "ended-1"}
    invalid = {**keyed, "input": {**keyed["input"], "window_seconds": 0}}
    unknown = {**keyed, "action_id": "no.such.action"}
    async with host_app(tmp_path, **settings) as (_, client):
        first = await client.post("/v1/host/directives", json=keyed, headers=bearer(tokens.alice))
        await poll_until(
            client, first.json()["status_href"], tokens.alice, lambda b: b["status"] == "completed"
        )
        bad = await client.post("/v1/host/directives", json=invalid, headers=bearer(tokens.alice))
        assert (bad.status_code, bad.json()["code"]) == (422, "invalid-input")
        lost = await client.post("/v1/host/directives", json=unknown, headers=bearer(tokens.alice))
        assert (lost.status_code, lost.json()["code"]) == (404, "unknown-action")
        other = {**keyed, "input": {**keyed["input"], "window_seconds": 2}}
        conflict = await client.post("/v1/host/directives", json=other, headers=bearer(tokens.alice))
        assert (conflict.status_code, conflict.json()["code"]) == (409, "idempotency-conflict")
        same = await client.post("/v1/host/directives", json=keyed, headers=bearer(tokens.alice))
        assert (same.status_code, same.content) == (202, first.content)
    async with host_app(tmp_path, **settings) as (_, client):
        bad = await client.post("/v1/host/directives", json=invalid, headers=bearer(tokens.alice))
        assert (bad.status_code, bad.json()["code"]) == (422, "invalid-input")
        same = await client.post("/v1/host/directives", json=keyed, headers=bearer(tokens.alice))
        assert (same.status_code, same.content) == (202, first.content)
    assert starts == ["ble"]
