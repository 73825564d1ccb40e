"""CONTRACT §4 and CONTRACT §2 step 8: idempotent repeats answer exactly as the first time and join the same
work."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from connector.core.admission import directive_fingerprint
from connector.core.policy import DeferredHostPolicy
from tests.api.support import (
    INFO,
    REDACT,
    RecordingFactory,
    assert_error,
    files_bytes,
    harness,
    query,
    straps,
)
from tests.support.directives import command_directive, scan_directive
from tests.support.waiting import wait_until


@pytest.mark.asyncio
async def test_same_key_same_directive_answers_identically_and_joins(tmp_path: Path) -> None:
    factory = RecordingFactory(straps(2), concurrent=True)
    async with harness(tmp_path, factory=factory) as h:
        first = await h.invoke("alice", scan_directive(3, key="scan-1", extra={"correlation/id": "c-1"}))
        assert first.status_code == 202
        await wait_until(lambda: factory.starts == 1)
        # Fields outside the fingerprint may differ: correlation, causal context, extensions.
        variants = [
            scan_directive(3, key="scan-1", extra={"correlation/id": "c-2"}),
            scan_directive(3, key="scan-1", extra={"causal/context": {"operation/id": "other"}}),
            scan_directive(3, key="scan-1", extra={"extensions": {"deployment": "x"}}),
        ]
        for directive in variants:
            again = await h.invoke("alice", directive)
            assert again.status_code == first.status_code
            assert again.content == first.content
            assert again.headers["location"] == first.headers["location"]
            assert again.headers["retry-after"] == first.headers["retry-after"]
        assert factory.starts == 1 and len(factory.requests) == 1
        assert h.assembled.discovery.active_count() == 1


@pytest.mark.asyncio
async def test_same_key_different_directive_conflicts(tmp_path: Path) -> None:
    factory = RecordingFactory(straps(1), concurrent=True)
    async with harness(tmp_path, factory=factory) as h:
        assert (await h.invoke("alice", scan_directive(3, key="k"))).status_code == 202
        for changed in (
            scan_directive(4, key="k"),
            scan_directive(3, key="k", timing={"timeout_ms": 9000}),
            scan_directive(3, key="k", filters={"name_prefix": "strap"}),
        ):
            assert_error(await h.invoke("alice", changed), 409, "idempotency-conflict")
        await wait_until(lambda: factory.starts == 1)
        assert len(factory.requests) == 1


@pytest.mark.asyncio
async def test_the_key_belongs_to_the_principal(tmp_path: Path) -> None:
    factory = RecordingFactory(straps(1), concurrent=True)
    async with harness(tmp_path, factory=factory) as h:
        mine = await h.invoke("alice", scan_directive(3, key="shared"))
        theirs = await h.invoke("bob", scan_directive(3, key="shared"))
        assert mine.status_code == theirs.status_code == 202
        mine_id, theirs_id = mine.json()["connector_operation/id"], theirs.json()["connector_operation/id"]
        assert mine_id != theirs_id
        await wait_until(lambda: factory.starts == 2)
        # Neither sees the other's operation.
        assert_error(await h.get("bob", f"/v1/operations/{mine_id}"), 404, "unknown-operation")


@pytest.mark.asyncio
async def test_no_digest_or_key_is_stored_for_discovery(tmp_path: Path) -> None:
    """The scan's durable record (CONTRACT §7 metadata) is stored; its fingerprint and key never are (CONTRACT
    §4)."""
    factory = RecordingFactory(straps(1), concurrent=True)
    async with harness(tmp_path, factory=factory) as h:
        directive = scan_directive(1, key="persist-nothing")
        accepted = await h.invoke("alice", directive)
        op_id = accepted.json()["connector_operation/id"]
        await h.poll("alice", accepted.headers["location"])
        await h.assembled.state.checkpoint()
        assert query(h.data_dir, "SELECT operation_id FROM command_operations") == []
        assert query(h.data_dir, "SELECT operation_id FROM discovery_operations") == [(op_id,)]
        stored = files_bytes(h.data_dir)
        fingerprint = directive_fingerprint(directive)
        device = (b"strap-0", b"02:00:00:00:00:00")
        for needle in (fingerprint, fingerprint.hex().encode(), b"persist-nothing", *device):
            assert needle not in stored


@pytest.mark.asyncio
async def test_concurrent_repeats_of_one_key_start_one_session(tmp_path: Path) -> None:
    factory = RecordingFactory(straps(1), concurrent=True)
    async with harness(tmp_path, factory=factory) as h:
        same = [h.invoke("alice", scan_directive(3, key="race")) for _ in range(8)]
        other = [h.invoke("alice", scan_directive(4, key="race")) for _ in range(8)]
        responses = await asyncio.gather(*(x for pair in zip(same, other, strict=True) for x in pair))
        accepted = [r for r in responses if r.status_code == 202]
        conflicts = [r for r in responses if r.status_code == 409]
        # Whichever directive came first owns the key: its repeats join it, the others conflict.
        assert len(accepted) == 8 and len(conflicts) == 8
        assert len({r.content for r in accepted}) == 1
        assert all(r.json()["code"] == "idempotency-conflict" for r in conflicts)
        await wait_until(lambda: factory.starts == 1)
        assert len(factory.requests) == 1


@pytest.mark.asyncio
async def test_concurrent_admissions_respect_the_per_principal_limit(tmp_path: Path) -> None:
    factory = RecordingFactory(straps(1), concurrent=True)
    async with harness(tmp_path, factory=factory) as h:
        h.assembled.service.policy = DeferredHostPolicy(max_operations_per_principal=3)
        responses = await asyncio.gather(*(h.invoke("alice", scan_directive(5)) for _ in range(10)))
        codes = sorted(r.status_code for r in responses)
        assert codes == [202] * 3 + [429] * 7
        await wait_until(lambda: factory.starts == 3)
        assert h.assembled.discovery.active_count() == 3


@pytest.mark.realtime  # a command subprocess
@pytest.mark.asyncio
async def test_command_repeats_answer_the_stored_operation(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(), wall=True) as h:
        async_directive = command_directive(REDACT, "async", {"text": "mail a@b.example"}, key="r-1")
        first = await h.invoke("alice", async_directive)
        assert first.status_code == 202
        second = await h.invoke("alice", {**async_directive, "correlation/id": "changed"})
        assert (second.status_code, second.content) == (202, first.content)
        changed = command_directive(REDACT, "async", {"text": "other"}, key="r-1")
        assert_error(await h.invoke("alice", changed), 409, "idempotency-conflict")

        sync_first = await h.invoke("alice", command_directive(INFO, "sync", key="i-1"))
        sync_again = await h.invoke("alice", command_directive(INFO, "sync", key="i-1"))
        assert sync_first.status_code == sync_again.status_code == 200
        assert sync_first.content == sync_again.content
        assert len(h.submits) == 2 and len(h.command_rows()) == 2


@pytest.mark.realtime  # a command subprocess
@pytest.mark.asyncio
async def test_concurrent_repeats_of_a_command_key_run_it_once(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(), wall=True) as h:
        directive = command_directive(REDACT, "sync", {"text": "call +48 601 234 567"}, key="once")
        responses = await asyncio.gather(*(h.invoke("alice", directive) for _ in range(6)))
        assert {r.status_code for r in responses} == {200}
        assert len({r.content for r in responses}) == 1
        assert len(h.submits) == 1 and len(h.command_rows()) == 1
