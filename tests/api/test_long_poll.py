"""CONTRACT §9 long poll: `?wait_seconds=W&after_revision=R` answers once the revision passes R or the status
turns terminal, else after W with the current status; W above 30 is clamped; waiting costs no CPU."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from connector.core.policy import MAX_WAIT_SECONDS
from connector.timer import VirtualTimer
from tests.api.support import (
    REDACT,
    SCAN,
    TERMINAL,
    RecordingFactory,
    assert_error,
    assert_valid,
    candidates_of,
    harness,
    strap,
)
from tests.support.directives import command_directive, scan_directive


def _revision(document: dict[str, Any]) -> int:
    return int((document.get("progress") or {}).get("revision", 0))


def _revised(document: dict[str, Any]) -> bool:
    return _revision(document) >= 1


@pytest.mark.asyncio
async def test_wakes_on_the_next_revision(tmp_path: Path) -> None:
    timer = VirtualTimer()
    factory = RecordingFactory([(0, strap(0)), (1500, strap(1))], timer=timer)
    async with harness(tmp_path, factory=factory, timer=timer) as h:
        started_ms = timer.now_ms()
        location = (await h.invoke("alice", scan_directive(10))).headers["location"]
        first = await h.settle("alice", location, _revised)
        assert _revision(first) == 1
        waiters = [
            asyncio.ensure_future(h.get("alice", location, wait_seconds=20, after_revision=1))
            for _ in range(10)
        ]
        # The second strap appears 1.5 s after the start: every waiter is woken by it, not by W.
        await timer.advance_to(started_ms + 1499)
        assert not any(waiter.done() for waiter in waiters)
        await timer.advance_to(started_ms + 1500)
        assert all(waiter.done() for waiter in waiters)
        documents = [(await waiter).json() for waiter in waiters]
        assert all(_revision(doc) == 2 and len(candidates_of(doc)) == 2 for doc in documents)
        assert_valid("deferred-operation-status.v2", [first, documents[0]])


@pytest.mark.asyncio
async def test_without_a_change_it_answers_after_w_and_does_not_spin(tmp_path: Path) -> None:
    timer = VirtualTimer()
    async with harness(tmp_path, factory=RecordingFactory([(0, strap(0))], timer=timer), timer=timer) as h:
        location = (await h.invoke("alice", scan_directive(10))).headers["location"]
        current = await h.settle("alice", location, _revised)
        parked_ms = timer.now_ms()
        # No R: "the current revision" - nothing newer comes, so the answer waits for W.
        waiter = asyncio.ensure_future(h.get("alice", location, wait_seconds=1))
        await timer.advance(0)
        # Parked, not spinning: every task is blocked (`advance` returned) and nothing wakes before W.
        assert not waiter.done() and timer.next_due_ms() == parked_ms + 1000
        await timer.advance(999)
        assert not waiter.done()
        await timer.advance(1)
        answer = await waiter
        assert answer.status_code == 200
        document = answer.json()
        # Still "running": it answered at W, not at the window's end.
        assert document["status"] == "running" and _revision(document) == _revision(current)
        # With R already passed the answer is immediate (no virtual time passes).
        behind_at_ms = timer.now_ms()
        behind = await h.get("alice", location, wait_seconds=25, after_revision=0)
        assert _revision(behind.json()) == 1 and timer.now_ms() == behind_at_ms


@pytest.mark.asyncio
async def test_a_terminal_status_ends_the_wait(tmp_path: Path) -> None:
    timer = VirtualTimer()
    async with harness(tmp_path, factory=RecordingFactory([(0, strap(0))], timer=timer), timer=timer) as h:
        location = (await h.invoke("alice", scan_directive(1))).headers["location"]
        await h.settle("alice", location, _revised)
        ends_ms = timer.now_ms() + 1000  # the 1 s window, not the 25 s wait
        waiter = asyncio.ensure_future(h.get("alice", location, wait_seconds=25, after_revision=1))
        await timer.run_until(waiter.done, limit_ms=10_000)
        assert (await waiter).json()["status"] == "completed"
        assert timer.now_ms() <= ends_ms + 1000
        # A cancel request ends the wait as well (a status change the caller must see).
        running = (await h.invoke("alice", scan_directive(20))).headers["location"]
        await h.settle("alice", running, _revised)
        waiter = asyncio.ensure_future(h.get("alice", running, wait_seconds=25, after_revision=1))
        await timer.advance(19_000)  # inside the 20 s window and the 25 s wait
        assert not waiter.done()
        cancel_at_ms = timer.now_ms()
        await h.post("alice", running + "/cancel")
        await timer.run_until(waiter.done, limit_ms=1000)
        settled = (await waiter).json()
        assert settled["status"] in ("running", "cancelled") and "progress" not in settled
        assert timer.now_ms() - cancel_at_ms < 1000


@pytest.mark.realtime  # a command subprocess
@pytest.mark.asyncio
async def test_commands_long_poll_until_terminal(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(), wall=True) as h:
        accepted = await h.invoke("alice", command_directive(REDACT, "async", {"text": "a@b.example"}))
        answer = await h.get("alice", accepted.headers["location"], wait_seconds=20)
        document = answer.json()
        assert document["status"] == "completed"
        assert_valid("deferred-operation-status.v1", document)


@pytest.mark.asyncio
async def test_w_above_30_is_clamped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    timer = VirtualTimer()
    async with harness(tmp_path, factory=RecordingFactory([(0, strap(0))], timer=timer), timer=timer) as h:
        seen: list[float] = []
        discovery = h.assembled.discovery
        original = discovery.status

        async def spy(op_id: str, *, after: int | None = None, wait_s: float = 0.0) -> dict[str, Any] | None:
            if wait_s:
                seen.append(wait_s)
            return await original(op_id, after=after, wait_s=wait_s)

        monkeypatch.setattr(discovery, "status", spy)
        location = (await h.invoke("alice", scan_directive(1))).headers["location"]
        await h.settle("alice", location, lambda d: d["status"] in TERMINAL)
        for asked in (31, 3600, 10**9):
            assert (await h.get("alice", location, wait_seconds=asked)).json()["status"] == "completed"
        assert seen == [MAX_WAIT_SECONDS] * 3 == [30] * 3


@pytest.mark.asyncio
async def test_a_revocation_during_the_wait_answers_unknown(tmp_path: Path) -> None:
    timer = VirtualTimer()
    async with harness(tmp_path, factory=RecordingFactory([(0, strap(0))], timer=timer), timer=timer) as h:
        location = (await h.invoke("alice", scan_directive(20))).headers["location"]
        await h.settle("alice", location, _revised)
        waiter = asyncio.ensure_future(h.get("alice", location, wait_seconds=25, after_revision=1))
        await timer.advance(1000)
        assert not waiter.done()
        revoke = await h.client.post(
            f"/v1/admin/principals/alice/revoke?action_id={SCAN}", headers=h.auth("root")
        )
        assert revoke.status_code == 200
        await timer.run_until(waiter.done, limit_ms=1000)
        assert_error(await waiter, 404, "unknown-operation")
