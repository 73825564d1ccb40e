"""CONTRACT §9 long poll: `?wait_seconds=W&after_revision=R` answers once the revision passes R or the status
turns terminal, else after W with the current status; W above 30 is clamped; waiting costs no CPU."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from connector.core.policy import MAX_WAIT_SECONDS
from tests.api.support import (
    REDACT,
    SCAN,
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


@pytest.mark.asyncio
async def test_wakes_on_the_next_revision(tmp_path: Path) -> None:
    factory = RecordingFactory([(0, strap(0)), (1500, strap(1))])
    async with harness(tmp_path, factory=factory) as h:
        location = (await h.invoke("alice", scan_directive(10))).headers["location"]
        first = (await h.poll("alice", location, lambda d: _revision(d) >= 1))[-1]
        assert _revision(first) == 1
        started = time.monotonic()
        waiters = [h.get("alice", location, wait_seconds=20, after_revision=1) for _ in range(10)]
        answers = await asyncio.gather(*waiters)
        elapsed = time.monotonic() - started
        documents = [answer.json() for answer in answers]
        assert all(_revision(doc) == 2 and len(candidates_of(doc)) == 2 for doc in documents)
        # The second strap appears 1.5 s after the start: every waiter was woken by it, not by W.
        assert 0.5 < elapsed < 10
        assert_valid("deferred-operation-status.v2", [first, documents[0]])


@pytest.mark.asyncio
async def test_without_a_change_it_answers_after_w_and_does_not_spin(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory([(0, strap(0))])) as h:
        location = (await h.invoke("alice", scan_directive(10))).headers["location"]
        current = (await h.poll("alice", location, lambda d: _revision(d) >= 1))[-1]
        wall, cpu = time.monotonic(), time.process_time()
        # No R: "the current revision" - nothing newer comes, so the answer waits for W.
        answer = await h.get("alice", location, wait_seconds=1)
        wall, cpu = time.monotonic() - wall, time.process_time() - cpu
        assert answer.status_code == 200
        document = answer.json()
        assert document["status"] == "running" and _revision(document) == _revision(current)
        assert 0.95 <= wall < 5  # still "running": it answered at W, not at the window's end
        assert cpu < 0.25 * wall  # a busy-waiting loop would burn the whole second
        # With R already passed the answer is immediate.
        started = time.monotonic()
        behind = await h.get("alice", location, wait_seconds=25, after_revision=0)
        assert _revision(behind.json()) == 1 and time.monotonic() - started < 10


@pytest.mark.asyncio
async def test_a_terminal_status_ends_the_wait(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory([(0, strap(0))])) as h:
        location = (await h.invoke("alice", scan_directive(1))).headers["location"]
        await h.poll("alice", location, lambda d: _revision(d) >= 1)
        started = time.monotonic()
        answer = await h.get("alice", location, wait_seconds=25, after_revision=1)
        assert answer.json()["status"] == "completed"
        assert time.monotonic() - started < 10
        # A cancel request ends the wait as well (a status change the caller must see).
        running = (await h.invoke("alice", scan_directive(20))).headers["location"]
        await h.poll("alice", running, lambda d: _revision(d) >= 1)
        waiter = asyncio.ensure_future(h.get("alice", running, wait_seconds=25, after_revision=1))
        await asyncio.sleep(0.2)  # wall clock: the waiter parks in the runtime's long poll
        assert not waiter.done()
        await h.post("alice", running + "/cancel")
        settled = (await asyncio.wait_for(waiter, 10.0)).json()
        assert settled["status"] in ("running", "cancelled") and "progress" not in settled


@pytest.mark.realtime  # a command subprocess
@pytest.mark.asyncio
async def test_commands_long_poll_until_terminal(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory()) as h:
        accepted = await h.invoke("alice", command_directive(REDACT, "async", {"text": "a@b.example"}))
        answer = await h.get("alice", accepted.headers["location"], wait_seconds=20)
        document = answer.json()
        assert document["status"] == "completed"
        assert_valid("deferred-operation-status.v1", document)


@pytest.mark.asyncio
async def test_w_above_30_is_clamped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with harness(tmp_path, factory=RecordingFactory([(0, strap(0))])) as h:
        seen: list[float] = []
        discovery = h.assembled.discovery
        original = discovery.status

        async def spy(op_id: str, *, after: int | None = None, wait_s: float = 0.0) -> dict[str, Any] | None:
            if wait_s:
                seen.append(wait_s)
            return await original(op_id, after=after, wait_s=wait_s)

        monkeypatch.setattr(discovery, "status", spy)
        location = (await h.invoke("alice", scan_directive(1))).headers["location"]
        await h.poll("alice", location)
        for asked in (31, 3600, 10**9):
            assert (await h.get("alice", location, wait_seconds=asked)).json()["status"] == "completed"
        assert seen == [MAX_WAIT_SECONDS] * 3 == [30] * 3


@pytest.mark.asyncio
async def test_a_revocation_during_the_wait_answers_unknown(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory([(0, strap(0))])) as h:
        location = (await h.invoke("alice", scan_directive(20))).headers["location"]
        await h.poll("alice", location, lambda d: _revision(d) >= 1)
        waiter = asyncio.ensure_future(h.get("alice", location, wait_seconds=25, after_revision=1))
        await asyncio.sleep(0.2)  # wall clock: the waiter parks in the runtime's long poll
        revoke = await h.client.post(
            f"/v1/admin/principals/alice/revoke?action_id={SCAN}", headers=h.auth("root")
        )
        assert revoke.status_code == 200
        assert_error(await asyncio.wait_for(waiter, 5.0), 404, "unknown-operation")
