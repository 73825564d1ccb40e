"""Command actions through the service: sync results, async handles and polls, cancellation."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from connector.core.policy import DeferredHostPolicy
from tests.api.support import (
    INFO,
    REDACT,
    SLEEP,
    STUBBORN,
    Harness,
    RecordingFactory,
    assert_error,
    assert_valid,
    harness,
)
from tests.support.directives import command_directive, scan_directive

pytestmark = pytest.mark.realtime  # every test runs command subprocesses


async def _pid_from(marker: Path) -> int:
    with anyio.fail_after(15):
        while not marker.exists():
            await anyio.sleep(0.02)  # real peer: the command subprocess writes its pid
    return int(marker.read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.asyncio
async def test_a_sync_action_answers_its_result(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(), wall=True) as h:
        response = await h.invoke("alice", command_directive(INFO, "sync"))
        assert response.status_code == 200 and "location" not in response.headers
        result = response.json()
        assert_valid("sensorium-directive-result.v1", result)
        assert result["status"] == "completed" and isinstance(result["result"]["json"], str)
        # `either` obeys the requested mode: sync never yields a handle.
        redacted = await h.invoke("alice", command_directive(REDACT, "sync", {"text": "mail a@b.example"}))
        assert redacted.status_code == 200
        assert redacted.json()["result"]["json"]["text"] == "mail [email]"


@pytest.mark.asyncio
async def test_an_async_action_is_polled_to_completion(tmp_path: Path) -> None:
    context = {"operation/id": "flow-7"}
    async with harness(tmp_path, factory=RecordingFactory(), wall=True) as h:
        directive = command_directive(
            REDACT, "async", {"text": "call +48 601 234 567"}, extra={"causal/context": context}
        )
        accepted = await h.invoke("alice", directive)
        assert accepted.status_code == 202
        handle = accepted.json()
        assert_valid("sensorium-connector-deferred.v1", handle)
        assert accepted.headers["location"] == handle["status_path"]
        assert accepted.headers["retry-after"] == str(handle["retry_after_seconds"])
        polls = await h.poll("alice", accepted.headers["location"])
        assert_valid("deferred-operation-status.v1", polls)
        final = polls[-1]
        assert final["status"] == "completed" and final["causal/context"] == context
        assert final["result"]["json"] == {"text": "call [phone]", "redactions": {"email": 0, "phone": 1}}


async def _running_sleeper(h: Harness) -> tuple[str, int]:
    accepted = await h.invoke("alice", command_directive(SLEEP, "async"))
    assert accepted.status_code == 202
    return accepted.headers["location"], await _pid_from(h.marker)


@pytest.mark.asyncio
async def test_cancel_terminates_the_process_before_answering_cancelled(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(), wall=True) as h:
        location, pid = await _running_sleeper(h)
        assert (await h.get("alice", location)).json()["status"] == "running"
        cancelled = await h.post("alice", location + "/cancel")
        assert cancelled.status_code == 200
        document = cancelled.json()
        assert document["status"] == "cancelled" and "error" not in document
        assert not _alive(pid)
        assert_valid("deferred-operation-status.v1", document)
        # Cancelling a terminal operation answers its unchanged status.
        again = await h.post("alice", location + "/cancel")
        assert (again.status_code, again.json()["status"]) == (200, "cancelled")
        # Another principal cannot cancel it, nor see that it exists.
        assert_error(await h.post("bob", location + "/cancel"), 404, "unknown-operation")


@pytest.mark.asyncio
async def test_non_cancelable_work_refuses_cancel(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(), wall=True) as h:
        accepted = await h.invoke("alice", command_directive(STUBBORN, "async"))
        assert accepted.status_code == 202
        handle = accepted.json()
        assert "cancel_path" not in handle and handle["cancel/unavailable-reason"]
        pid = await _pid_from(h.marker.with_name(h.marker.name + ".stubborn"))
        refused = await h.post("alice", accepted.headers["location"] + "/cancel")
        assert_error(refused, 409, "not-cancelable")
        assert _alive(pid)
    # Leaving the connector stops its work all the same.
    assert not _alive(pid)


@pytest.mark.asyncio
async def test_the_per_principal_limit_counts_live_commands_only(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(), wall=True) as h:
        h.assembled.service.policy = DeferredHostPolicy(max_operations_per_principal=2)
        # Finished work does not count, however much of it there was.
        for _ in range(5):
            assert (await h.invoke("alice", command_directive(INFO, "sync"))).status_code == 200
        first = await h.invoke("alice", command_directive(SLEEP, "async"))
        await _pid_from(h.marker)
        second = await h.invoke("alice", command_directive(STUBBORN, "async"))
        assert first.status_code == second.status_code == 202
        assert_error(await h.invoke("alice", command_directive(INFO, "sync")), 429, "too-many-operations")
        assert_error(await h.invoke("alice", scan_directive(1)), 429, "too-many-operations")
        assert (await h.post("alice", first.headers["location"] + "/cancel")).json()["status"] == "cancelled"
        assert (await h.invoke("alice", command_directive(INFO, "sync"))).status_code == 200
