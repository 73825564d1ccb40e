"""Issue 13 (D1, D2, bounded memory): every accepted scan is durable before its 202; after a restart it
answers `failed` `interrupted-by-restart`; a keyed retry answers the recorded first answer and starts
nothing; erased sessions leave memory; the per-principal limit holds under concurrent admissions."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from connector.storage.state import DiscoveryRecord
from connector.timer import VirtualTimer
from tests.api.support import (
    SLEEP,
    RecordingFactory,
    assert_error,
    assert_valid,
    candidates_of,
    harness,
    query,
    straps,
)
from tests.support.commits import CommitGate
from tests.support.directives import command_directive, scan_directive
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio


async def test_the_record_is_written_before_the_202_and_no_record_means_no_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    factory = RecordingFactory(straps(1), concurrent=True)
    async with harness(tmp_path, factory=factory) as h:
        state = h.assembled.state
        recorded: list[DiscoveryRecord] = []
        original = state.insert_discovery

        async def spying(record: DiscoveryRecord) -> None:
            # The session must not run before its record is durable.
            assert factory.starts == 0 and record.status == "pending"
            await original(record)
            recorded.append(record)

        monkeypatch.setattr(state, "insert_discovery", spying)
        accepted = await h.invoke("alice", scan_directive(1, key="first"))
        assert accepted.status_code == 202 and len(recorded) == 1
        op_id = accepted.json()["connector_operation/id"]
        assert query(h.data_dir, "SELECT operation_id, status FROM discovery_operations") == [
            (op_id, "pending")
        ]
        assert recorded[0].reply == accepted.json()
        assert set(recorded[0].metadata) <= {
            "operation/id", "operation/kind", "owner", "action_id", "status", "created_at", "updated_at",
            "scope", "disclosed_count", "cleanup", "expires_at",
        }  # fmt: skip
        await h.poll("alice", accepted.headers["location"])

        async def failing(record: DiscoveryRecord) -> None:
            raise OSError("disk full")

        monkeypatch.setattr(state, "insert_discovery", failing)
        starts = factory.starts
        refused = await h.invoke("alice", scan_directive(1, key="second"))
        assert_error(refused, 500, "internal")
        assert factory.starts == starts and h.assembled.discovery.active_count() == 0
        assert len(list(h.assembled.discovery.operation_ids())) == 1  # the refused one is gone
        # The key was not taken: a later admission with it starts normally.
        monkeypatch.setattr(state, "insert_discovery", original)
        assert (await h.invoke("alice", scan_directive(1, key="second"))).status_code == 202


async def test_concurrent_admissions_share_commits_and_each_202_leaves_after_its_own(tmp_path: Path) -> None:
    """CONTRACT §7: eight admissions, two fsyncs; no 202 before the commit that holds its row."""
    async with harness(tmp_path, factory=RecordingFactory(concurrent=True)) as h:
        gate = CommitGate(h.assembled.state)
        gate.hold()
        replies: list[tuple[httpx.Response, set[str]]] = []  # each 202, with the rows committed when it came

        async def admit() -> None:
            accepted = await h.invoke("alice", scan_directive(30))
            committed = {row[0] for row in query(h.data_dir, "SELECT operation_id FROM discovery_operations")}
            replies.append((accepted, committed))

        async with anyio.create_task_group() as group:
            group.start_soon(admit)
            await wait_until(lambda: gate.held_commits == 1)  # the first admission's row is at its fsync
            for _ in range(7):
                group.start_soon(admit)
            await wait_until(lambda: h.assembled.state.queued_writes == 7)  # the others queue behind it
            assert replies == [] and h.factory is not None and h.factory.starts == 0
            gate.release()
        assert [len(ids) for ids in gate.groups] == [1, 7]
        for accepted, committed in replies:
            assert accepted.status_code == 202
            assert accepted.json()["connector_operation/id"] in committed


async def test_after_a_restart_a_scan_is_interrupted_and_a_keyed_retry_starts_nothing(tmp_path: Path) -> None:
    keyed = scan_directive(30, key="run-7")
    async with harness(tmp_path, factory=RecordingFactory(straps(2), concurrent=True)) as h:
        first = await h.invoke("alice", keyed)
        plain = await h.invoke("alice", scan_directive(30))
        for accepted in (first, plain):
            await h.poll("alice", accepted.headers["location"], lambda d: d["status"] == "running")
        tokens = h.tokens
    again = RecordingFactory(straps(2), concurrent=True)
    async with harness(tmp_path, factory=again, tokens=tokens) as h:
        for accepted in (first, plain):
            status = (await h.get("alice", accepted.headers["location"])).json()
            assert_valid("deferred-operation-status.v2", status)
            assert (status["status"], status["error"]["code"]) == ("failed", "interrupted-by-restart")
            assert status["cleanup"] == {"state": "confirmed", "claim": "released"}
            assert "progress" not in status and "result" not in status
            assert_error(await h.get("bob", accepted.headers["location"]), 404, "unknown-operation")
        retry = await h.invoke("alice", keyed)
        assert (retry.status_code, retry.content) == (first.status_code, first.content)
        assert retry.headers["location"] == first.headers["location"]
        # The fingerprint did not survive: another directive with the key gets the first answer too.
        other = await h.invoke("alice", scan_directive(5, key="run-7"))
        assert (other.status_code, other.content) == (first.status_code, first.content)
        assert again.requests == [] and again.starts == 0
        assert list(h.assembled.discovery.operation_ids()) == []


async def test_an_erased_session_leaves_memory_and_its_record_answers_the_same(tmp_path: Path) -> None:
    factory = RecordingFactory(straps(3), concurrent=True)
    async with harness(tmp_path, factory=factory, result_retention_seconds=1) as h:
        accepted = await h.invoke("alice", scan_directive(1, key="keep"))
        op_id = accepted.json()["connector_operation/id"]
        polls = await h.poll("alice", accepted.headers["location"])
        completed = polls[-1]
        assert completed["status"] == "completed" and len(candidates_of(completed)) == 3
        assert h.timer is not None
        await h.timer.run_until(lambda: h.assembled.discovery.session(op_id) is None)
        after = (await h.get("alice", accepted.headers["location"])).json()
        assert after["result"]["candidates"] == [] and "erased_at" in after["result"]
        expected = {k: v for k, v in completed.items() if k != "progress"}
        expected["result"] = {
            **completed["result"],
            "candidates": [],
            "erased_at": after["result"]["erased_at"],
        }
        assert after == expected
        assert_valid("deferred-operation-status.v2", [*polls, after, after])
        # Every route still answers, from the record.
        cancelled = await h.post("alice", f"/v1/operations/{op_id}/cancel")
        assert (cancelled.status_code, cancelled.json()) == (200, after)
        waited = await h.get("alice", accepted.headers["location"], wait_seconds=5)
        assert waited.json() == after
        ref = completed["result"]["candidates"][0]["candidate/ref"]
        body = {"candidate/ref": ref, "idempotency_key": "b-1"}
        assert_error(
            await h.post("alice", f"/v1/operations/{op_id}/bindings", body), 404, "unknown-candidate"
        )
        assert_error(await h.get("bob", accepted.headers["location"]), 404, "unknown-operation")
        # A keyed repeat answers the first handle and starts nothing.
        starts = factory.starts
        repeat = await h.invoke("alice", scan_directive(1, key="keep"))
        assert (repeat.status_code, repeat.content) == (202, accepted.content) and factory.starts == starts


async def test_ended_sessions_keep_no_task_each(tmp_path: Path) -> None:
    """One retention sweeper: completed sessions do not each keep a sleeping task until retention ends."""
    timer = VirtualTimer()
    factory = RecordingFactory(straps(1), concurrent=True, timer=timer)
    async with harness(tmp_path, factory=factory, timer=timer) as h:
        baseline = len(asyncio.all_tasks())
        owners = ("alice", "bob") * 6
        accepted = [await h.invoke(who, scan_directive(1)) for who in owners]
        for who, response in zip(owners, accepted, strict=True):
            await h.settle(who, response.headers["location"])
        # No virtual time passes (the advance waits for the sessions' last writes on aiosqlite's thread):
        # a session task kept until retention (600 s) would still be here.
        await timer.advance(0)
        assert len(asyncio.all_tasks()) <= baseline + 1
        assert len(list(h.assembled.discovery.operation_ids())) == 12  # results retained (600 s)
        assert h.assembled.discovery.active_count() == 0


async def test_concurrent_admissions_never_overrun_the_per_principal_limit(tmp_path: Path) -> None:
    """Issue D2: 40 concurrent keyed admissions, scans and slow async commands, against a limit of 16."""
    for round_no in range(3):
        async with harness(tmp_path / f"r{round_no}", factory=RecordingFactory(concurrent=True)) as h:
            directives: list[dict[str, Any]] = []
            for index in range(40):
                if index % 2:
                    directives.append(scan_directive(30, key=f"scan-{index}"))
                else:
                    directives.append(
                        {**command_directive(SLEEP, "async"), "idempotency_key": f"cmd-{index}"}
                    )
            answers = await asyncio.gather(*(h.invoke("alice", d) for d in directives))
            codes = sorted(a.status_code for a in answers)
            assert codes.count(202) == 16 and codes.count(429) == 24, codes
            live = [a for a in answers if a.status_code == 202]
            statuses = [(await h.get("alice", a.headers["location"])).json()["status"] for a in live]
            assert all(s in ("pending", "running") for s in statuses)
