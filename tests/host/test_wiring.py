"""The host inside the serve process: routes, counters at /metrics, retention, and a real kill -9 restart."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from connector.cli.serve_cmd import extra_routers
from connector.storage.registry import REGISTRY_RELATIVE_PATH
from connector.timer import VirtualTimer
from tests.host.support import add_principals, check, host_app, next_due, poll_until, terminal
from tests.support.directives import command_directive, scan_directive
from tests.support.paths import HW_FIXTURES, SHIPPED_CATALOG, SHIPPED_TRUST
from tests.support.principals import bearer
from tests.support.serving import serving

pytestmark = pytest.mark.asyncio


async def test_serve_mounts_the_host_routes_and_publishes_its_counters(tmp_path: Path) -> None:
    tokens = add_principals(tmp_path)
    timer = VirtualTimer()
    async with host_app(tmp_path, timer=timer) as (assembled, client):
        paths = {getattr(route, "path", "") for router in extra_routers(assembled) for route in router.routes}
        assert {"/v1/host/directives", "/v1/host/operations/{operation_id}",
                "/v1/admin/deferred-operations/{operation_id}/cancel"} <= paths  # fmt: skip
        openapi = (await client.get("/openapi.json")).json()
        assert "/v1/host/directives" in openapi["paths"]
        accepted = await client.post(
            "/v1/host/directives", json=scan_directive(1), headers=bearer(tokens.alice)
        )
        # The poller alone (no caller polls) brings it to its end: the 1 s window, then the poller's cadence.
        ends_ms = timer.now_ms() + 1000
        while (record := await assembled.registry.get(accepted.json()["operation/id"])) is None or (
            not record.terminal
        ):
            await next_due(timer, by_ms=ends_ms + 15_000)
        metrics = (await client.get("/metrics")).text
    for name in ("polls_total", "terminal_outcomes_total", "expirations_total", "poll_errors_total",
                 "continuations_total", "operations_active"):  # fmt: skip
        assert f"sensorium_host_{name}" in metrics
    assert re.search(r'sensorium_host_terminal_outcomes_total\{status="completed"\} 1\.0', metrics)
    assert float(re.findall(r"^sensorium_host_polls_total (\S+)$", metrics, re.M)[0]) >= 1
    assert "sensorium_discovery_sessions_active" in metrics


@pytest.mark.realtime  # a command subprocess
async def test_terminal_metadata_is_forgotten_after_retention(tmp_path: Path) -> None:
    tokens = add_principals(tmp_path)
    async with host_app(tmp_path, host_poller=False, host_retention_seconds=60) as (assembled, client):
        assert assembled.host.retention == timedelta(seconds=60)
        directive = command_directive("whisper.redaction.prepare", input={"text": "x"})
        accepted = (
            await client.post("/v1/host/directives", json=directive, headers=bearer(tokens.alice))
        ).json()
        await poll_until(client, accepted["status_href"], tokens.alice, terminal)
        op_id = accepted["operation/id"]
        now = assembled.host.clock()
        assert await assembled.host.purge(now + timedelta(seconds=30)) == 0  # still within retention
        assert await assembled.host.durable_view(op_id) is not None
        assert await assembled.host.purge(now + timedelta(seconds=61)) == 1
        never = await client.get(f"/v1/host/operations/deferred:sensorium.directive.invoke:{'W' * 26}",
                                 headers=bearer(tokens.alice))  # fmt: skip
        gone = await client.get(accepted["status_href"], headers=bearer(tokens.alice))
        assert (gone.status_code, gone.content) == (404, never.content)
        # The operator view lists what the host OR the connector still holds (CONTRACT §9); the connector's
        # own record goes with the same retention (`ConnectorService.sweep_metadata`).
        await assembled.commands.purge(now + timedelta(seconds=61), timedelta(seconds=60))
        detail = await client.get(f"/v1/admin/deferred-operations/{op_id}", headers=bearer(tokens.operator))
        assert detail.status_code == 404 and detail.json()["code"] == "unknown-operation"
        assert await assembled.host.durable_view(op_id) is None


@contextmanager
def _serve(data_dir: Path, log: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A real `serve` on 127.0.0.1, port chosen by the OS, BLE replayed at real speed."""
    args: list[str | Path] = ["--data-dir", data_dir, "--catalog", SHIPPED_CATALOG, "--trust", SHIPPED_TRUST]
    args += ["--replay", f"ble={HW_FIXTURES / 'ble-heart-rate-lab.jsonl'}"]
    with serving(*args, log=log, stdout=log) as server:
        yield server.process, server.base_url


@pytest.mark.serve
@pytest.mark.realtime  # serve processes and kill -9
async def test_a_killed_serve_restarts_with_its_scan_interrupted(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    tokens = add_principals(data_dir)
    with _serve(data_dir, tmp_path / "first.log") as (process, url):
        async with httpx.AsyncClient(base_url=url) as client:
            accepted = await client.post(
                "/v1/host/directives", json=scan_directive(30), headers=bearer(tokens.alice)
            )
            assert accepted.status_code == 202
            handle = accepted.json()
            await poll_until(client, handle["status_href"], tokens.alice, lambda b: b["status"] == "running")
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    with sqlite3.connect(data_dir / REGISTRY_RELATIVE_PATH) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert db.execute("SELECT status FROM operations").fetchall() == [("running",)]
    with _serve(data_dir, tmp_path / "second.log") as (process, url):
        async with httpx.AsyncClient(base_url=url) as client:
            status = (await client.get(handle["status_href"], headers=bearer(tokens.alice))).json()
            check("deferred-operation-status.v2", status)
            assert status["status"] == "failed" and status["error"]["code"] == "interrupted-by-restart"
            detail = await client.get(
                f"/v1/admin/deferred-operations/{handle['operation/id']}", headers=bearer(tokens.operator)
            )
            assert detail.json()["operation"]["last_error"] == "interrupted-by-restart"
            assert (await client.get("/healthz")).status_code == 200
