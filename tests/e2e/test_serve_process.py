"""End to end against real `serve` processes: replay fixtures, SIGTERM, restarts, a tampered catalog."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from connector.cli.serve_cmd import listen
from tests.api.support import (
    HEART_RATE_LAB,
    INFO,
    REDACT,
    SLEEP,
    STUBBORN,
    TERMINAL,
    add_test_principals,
    assert_valid,
    candidates_of,
    write_test_catalog,
)
from tests.support.directives import command_directive, scan_directive
from tests.support.paths import SHIPPED_CATALOG, SHIPPED_TRUST
from tests.support.serving import serve_argv, serving_async, spawn, wait_exit


async def _poll(
    client: httpx.AsyncClient, location: str, token: str, until: Any = None
) -> list[dict[str, Any]]:
    until = until or (lambda doc: doc["status"] in TERMINAL)
    polls: list[dict[str, Any]] = []
    with anyio.fail_after(20):
        while True:
            response = await client.get(location, headers={"Authorization": f"Bearer {token}"})
            assert response.status_code == 200, response.text
            polls.append(response.json())
            if until(polls[-1]):
                return polls
            await anyio.sleep(0.1)  # real peer: the serve process


async def _pid_from(marker: Path) -> int:
    with anyio.fail_after(20):
        while not marker.exists():
            await anyio.sleep(0.05)  # real peer: the command subprocess writes its pid
    return int(marker.read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.serve
@pytest.mark.asyncio
async def test_replay_end_to_end(tmp_path: Path) -> None:
    data = tmp_path / "data"
    tokens = add_test_principals(data)
    auth = {"Authorization": f"Bearer {tokens['alice']}"}
    log = tmp_path / "serve.log"
    replay = ("--replay", f"ble={HEART_RATE_LAB}", "--replay-speed", "10")
    async with (
        serving_async("--data-dir", data, *replay, log=log) as served,
        httpx.AsyncClient(base_url=served.base_url, timeout=30) as client,
    ):
        assert (await client.get("/healthz")).status_code == 200
        accepted = await client.post("/v1/directives", json=scan_directive(2), headers=auth)
        assert accepted.status_code == 202
        location = accepted.headers["location"]
        running = await _poll(
            client, location, tokens["alice"], lambda d: bool(candidates_of(d)) or d["status"] in TERMINAL
        )
        ref = candidates_of(running[-1])[0]["candidate/ref"]
        assert (
            await client.post(location + "/selection", json={"candidate/ref": ref}, headers=auth)
        ).status_code == 200
        polls = running + await _poll(client, location, tokens["alice"])
        assert_valid("deferred-operation-status.v2", polls)
        assert polls[-1]["status"] == "completed"
        bound = await client.post(
            location + "/bindings", json={"candidate/ref": ref, "idempotency_key": "e2e"}, headers=auth
        )
        assert bound.status_code == 201
        binding = bound.json()
        assert (await client.delete(f"/v1/bindings/{binding['binding/id']}", headers=auth)).status_code == 204

    text = log.read_text()
    assert "Traceback" not in text
    for private in (binding["address"], binding.get("label", "SYNTH"), ref):
        assert private not in text


@pytest.mark.serve
@pytest.mark.asyncio
async def test_sigterm_stops_sessions_and_work_then_exits_0(tmp_path: Path) -> None:
    data = tmp_path / "data"
    tokens = add_test_principals(data)
    auth = {"Authorization": f"Bearer {tokens['alice']}"}
    marker = tmp_path / "sleeper.pid"
    catalog, trust = write_test_catalog(tmp_path / "catalog", marker)
    log = tmp_path / "serve.log"
    args = ("--data-dir", data, "--catalog", catalog, "--trust", trust, "--replay", f"ble={HEART_RATE_LAB}")
    child = 0
    try:
        async with (
            serving_async(*args, log=log) as served,
            httpx.AsyncClient(base_url=served.base_url, timeout=30) as client,
        ):
            scan = await client.post("/v1/directives", json=scan_directive(30), headers=auth)
            await _poll(client, scan.headers["location"], tokens["alice"], lambda d: d["status"] == "running")
            work = await client.post(
                "/v1/directives", json=command_directive(STUBBORN, "async"), headers=auth
            )
            assert work.status_code == 202
            child = await _pid_from(marker.with_name(marker.name + ".stubborn"))
            exit_code = await served.stop_async(signal.SIGTERM, timeout=10)
        text = log.read_text()
        assert "shutting down: stopping sessions with confirmed cleanup" in text
        assert not _alive(child)
        assert exit_code == 0 and text.rstrip().endswith("stopped")
    finally:
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.serve
@pytest.mark.asyncio
async def test_command_results_survive_a_restart_and_dead_work_is_interrupted(tmp_path: Path) -> None:
    data = tmp_path / "data"
    tokens = add_test_principals(data)
    auth = {"Authorization": f"Bearer {tokens['alice']}"}
    marker = tmp_path / "sleeper.pid"
    catalog, trust = write_test_catalog(tmp_path / "catalog", marker)
    args = ("--data-dir", data, "--catalog", catalog, "--trust", trust, "--replay", f"ble={HEART_RATE_LAB}")
    sleeper = 0
    try:
        async with (
            serving_async(*args, log=tmp_path / "first.log") as first,
            httpx.AsyncClient(base_url=first.base_url, timeout=30) as client,
        ):
            info = await client.post(
                "/v1/directives", json=command_directive(INFO, "sync", key="info-1"), headers=auth
            )
            assert info.status_code == 200
            redact = await client.post(
                "/v1/directives",
                json=command_directive(REDACT, "async", {"text": "a@b.example"}),
                headers=auth,
            )
            finished = (await _poll(client, redact.headers["location"], tokens["alice"]))[-1]
            assert finished["status"] == "completed"
            sleep = await client.post("/v1/directives", json=command_directive(SLEEP, "async"), headers=auth)
            sleeper = await _pid_from(marker)
            scan = await client.post("/v1/directives", json=scan_directive(30), headers=auth)
            assert scan.status_code == 202
            # The process dies without any chance to clean up; its child is killed with it.
            assert await first.stop_async(signal.SIGKILL) == -signal.SIGKILL
        os.kill(sleeper, signal.SIGKILL)

        async with (
            serving_async(*args, log=tmp_path / "second.log") as second,
            httpx.AsyncClient(base_url=second.base_url, timeout=30) as client,
        ):
            again = await client.get(redact.headers["location"], headers=auth)
            assert again.status_code == 200
            assert {k: again.json()[k] for k in ("status", "result")} == {
                k: finished[k] for k in ("status", "result")
            }
            died = (await client.get(sleep.headers["location"], headers=auth)).json()
            assert (died["status"], died["error"]["code"]) == ("failed", "interrupted-by-restart")
            assert_valid("deferred-operation-status.v1", died)
            replay = await client.post(
                "/v1/directives", json=command_directive(INFO, "sync", key="info-1"), headers=auth
            )
            assert (replay.status_code, replay.content) == (200, info.content)
            # A scan's durable record survives (CONTRACT §6.6): interrupted, cleanup confirmed, claim
            # released; no list is rebuilt and no scan restarts.
            cut = (await client.get(scan.headers["location"], headers=auth)).json()
            assert_valid("deferred-operation-status.v2", cut)
            assert (cut["status"], cut["error"]["code"]) == ("failed", "interrupted-by-restart")
            assert cut["cleanup"] == {"state": "confirmed", "claim": "released"} and "progress" not in cut

    finally:
        if sleeper and _alive(sleeper):
            os.kill(sleeper, signal.SIGKILL)


@pytest.mark.serve
@pytest.mark.asyncio
async def test_serve_refuses_a_tampered_catalog_with_exit_2(tmp_path: Path) -> None:
    catalog = tmp_path / "actions.json"
    document = json.loads(SHIPPED_CATALOG.read_text(encoding="utf-8"))
    document["actions"][0]["discovery"]["max_window_seconds"] = 600
    catalog.write_text(json.dumps(document, indent=2), encoding="utf-8")
    shutil.copy(SHIPPED_CATALOG.with_name("actions.json.sig"), tmp_path / "actions.json.sig")
    log = tmp_path / "serve.log"
    argv = serve_argv("--data-dir", tmp_path / "data", "--catalog", catalog, "--trust", SHIPPED_TRUST)
    assert await wait_exit(spawn(argv, log), 30) == 2
    text = log.read_text()
    assert "catalog refused (catalog-bad-signature)" in text
    assert "serving on" not in text


def test_accepted_sockets_have_tcp_nodelay() -> None:
    """Accepted sockets need TCP_NODELAY: uvicorn writes headers and body separately (Nagle + delayed ACK)."""
    with (
        listen("127.0.0.1", 0) as listener,
        socket.create_connection(listener.getsockname()[:2]) as client,
    ):
        accepted, _ = listener.accept()
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0  # the kernel default
