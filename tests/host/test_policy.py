"""Host admission under `DeferredHostPolicy`: clamps, expiry narrowing, the 202 shape, durability."""

from __future__ import annotations

import json
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from connector.core.ids import keyed_operation_id
from connector.core.policy import DeferredHostPolicy
from connector.errors import SensoriumError
from connector.service.answers import Accepted, Done, public_refusal
from connector.storage.registry import REGISTRY_RELATIVE_PATH
from tests.host.fakes import TOKENS, Jitter, fake_host
from tests.host.fakes import directive as make_directive
from tests.host.records import T0
from tests.host.support import check, parse_time
from tests.support.clocks import ManualClock

pytestmark = pytest.mark.asyncio
ALICE = TOKENS["alice"]


async def _admit(
    tmp_path: Path,
    handle: dict[str, Any] | None = None,
    *,
    policy: DeferredHostPolicy | None = None,
    jitter: Jitter | None = None,
    **directive_extra: Any,
) -> tuple[Accepted, Any]:
    host, port, _ = await fake_host(tmp_path, policy=policy, jitter=jitter)
    port.next_handle = dict(handle or {})
    timing = directive_extra.pop("timing", {})
    action = directive_extra.pop("action_id", "device.discovery.scan")
    directive = make_directive(action, **timing) | directive_extra
    try:
        answer = await host.admit(host.authenticate(ALICE), directive)
        assert isinstance(answer, Accepted)
        record = await host.registry.get(answer.handle["operation/id"])
    finally:
        await host.registry.aclose()
    return answer, record


async def test_the_202_is_a_valid_deferred_operation_with_location_and_retry_after(tmp_path: Path) -> None:
    lineage: dict[str, Any] = {
        "correlation/id": "corr-7",
        "causal/context": {"operation/id": "causal-1", "trace/id": "t-1"},
    }
    answer, record = await _admit(tmp_path, **lineage)
    body = dict(answer.handle)
    check("deferred-operation.v1", body)
    op_id = body["operation/id"]
    assert (answer.status_path, answer.retry_after_seconds) == (f"/v1/host/operations/{op_id}", 1)
    assert body["status_href"] == f"/v1/host/operations/{op_id}"
    assert body["cancel_href"] == f"/v1/host/operations/{op_id}/cancel"
    assert "cancel/unavailable-reason" not in body
    assert body["audit/outcome-ref"] == f"outcome:{op_id}:1"
    assert body["correlation/id"] == "corr-7"
    assert body["causal/context"] == {"operation/id": "causal-1", "trace/id": "t-1"}
    assert body["owner_module_id"] == "sensorium-os" and body["capability_id"] == "device.discovery.scan"
    assert body["created_at"] == "2027-01-01T12:00:00.000Z"
    assert record.handle == body and record.owner == "alice" and record.correlation_id == "corr-7"
    assert record.next_poll_at == T0 + timedelta(seconds=1)


async def test_a_handle_never_echoes_the_input(tmp_path: Path) -> None:
    answer, _ = await _admit(tmp_path, input={"text": "CANARY-input-7781"})
    assert "CANARY-input-7781" not in json.dumps(answer.handle)


@pytest.mark.parametrize(
    ("hint", "jitter", "expected"),
    [(0, 0.0, 1), (1, 0.999, 1), (30, 0.0, 30), (30, 0.999, 32), (500, 0.0, 60), (59, 0.999, 60)],
)
async def test_retry_after_is_clamped_then_jittered_up_to_ten_percent(
    tmp_path: Path, hint: int, jitter: float, expected: int
) -> None:
    answer, record = await _admit(tmp_path, {"retry_after_seconds": hint}, jitter=Jitter(jitter))
    assert answer.handle["retry_after_seconds"] == answer.retry_after_seconds == expected
    assert record.retry_after_seconds == expected


@pytest.mark.parametrize(
    ("action", "handle", "timing", "policy", "ttl"),
    [
        ("test.free", {}, {}, {}, 900),  # no hints: the host's 15 minutes
        ("device.discovery.scan", {}, {}, {}, 300),  # the action's preferred TTL
        ("device.discovery.scan", {"fail_after_seconds": 100}, {}, {}, 100),  # the connector's hint
        ("test.free", {"fail_after_seconds": 5000}, {}, {}, 900),  # a hint never extends
        (
            "device.discovery.scan",
            {"fail_after_seconds": 100},
            {"deadline_at": "2027-01-01T12:00:40Z"},
            {},
            40,
        ),
        ("test.free", {}, {"deadline_at": "2027-01-01T11:00:00Z"}, {}, 0),  # a past deadline: expires now
        ("device.discovery.scan", {}, {}, {"max_ttl_seconds": 60}, 60),  # configured host maximum
    ],
)
async def test_expires_at_is_narrowed_by_every_present_hint(
    tmp_path: Path,
    action: str,
    handle: dict[str, Any],
    timing: dict[str, Any],
    policy: dict[str, Any],
    ttl: int,
) -> None:
    answer, record = await _admit(
        tmp_path, handle, policy=DeferredHostPolicy(**policy), timing=timing, action_id=action
    )
    body = answer.handle
    assert parse_time(body["expires_at"]) == T0 + timedelta(seconds=ttl)
    assert record.expires_at == T0 + timedelta(seconds=ttl)
    assert record.next_poll_at <= record.expires_at


async def test_non_cancelable_work_carries_its_reason_instead_of_a_cancel_href(tmp_path: Path) -> None:
    answer, record = await _admit(
        tmp_path, {"cancel/unavailable-reason": "irreversible phase"}, action_id="whisper.redaction.prepare"
    )
    body = dict(answer.handle)
    check("deferred-operation.v1", body)
    assert body["cancel/unavailable-reason"] == "irreversible phase" and "cancel_href" not in body
    assert record.cancelable is False and record.cancel_unavailable_reason == "irreversible phase"


async def test_sync_answers_and_refusals_pass_through_without_a_row(tmp_path: Path) -> None:
    host, port, _ = await fake_host(tmp_path)
    try:
        result = {
            "schema": "sensorium-directive-result.v1",
            "action_id": "test.free",
            "status": "completed",
            "result": {"json": 1},
            "diagnostics": [],
        }
        port.sync_answer = Done(result)
        assert await host.admit(host.authenticate(ALICE), make_directive("test.free")) == Done(result)
        refusal = SensoriumError("m", code="transport-claimed", retry_after_seconds=1)
        port.sync_answer = refusal
        with pytest.raises(SensoriumError) as refused:
            await host.admit(host.authenticate(ALICE), make_directive())
        assert refused.value is refusal
        with pytest.raises(SensoriumError) as unauthenticated:
            await host.admit(host.authenticate("wrong"), make_directive())
        assert unauthenticated.value.code == "unauthenticated"
        assert await host.registry.list() == []
    finally:
        await host.registry.aclose()


async def test_a_repeat_answers_the_first_handle_byte_for_byte(tmp_path: Path) -> None:
    host, port, clock = await fake_host(tmp_path, jitter=Jitter(0.0, 0.9))
    try:
        port.next_handle = {
            "connector_operation/id": "deferred:sensorium.directive.invoke:" + "A" * 26,
            "retry_after_seconds": 30,
        }
        first = await host.admit(host.authenticate(ALICE), make_directive(**{"correlation/id": "one"}))
        clock.advance(20)
        port.next_handle = {
            "connector_operation/id": "deferred:sensorium.directive.invoke:" + "A" * 26,
            "retry_after_seconds": 30,
        }
        second = await host.admit(host.authenticate(ALICE), make_directive(**{"correlation/id": "two"}))
        assert isinstance(first, Accepted) and isinstance(second, Accepted)
        assert json.dumps(first.handle) == json.dumps(second.handle)
        assert (first.status_path, first.retry_after_seconds) == (
            second.status_path,
            second.retry_after_seconds,
        )
        assert len(await host.registry.list()) == 1
    finally:
        await host.registry.aclose()


async def test_identify_for_the_bus_is_the_connectors_steps_2_3_and_keyed_id(tmp_path: Path) -> None:
    host, _, _ = await fake_host(tmp_path)
    try:
        alice = host.authenticate(ALICE)
        known = host.identify(alice, make_directive(), bus_op="bus-7")
        assert known.action.action_id == "device.discovery.scan" and known.key == "bus-7"
        assert known.keyed_id == keyed_operation_id("alice", "device.discovery.scan", "bus-7")
        with pytest.raises(SensoriumError) as sync:
            host.identify(alice, make_directive("test.free", mode="sync"), bus_op="bus-8")
        assert sync.value.code == "execution-mode-not-supported", "the Bus starts operations only"
        with pytest.raises(SensoriumError) as unknown:
            host.identify(alice, make_directive("no.such.action"), bus_op="bus-9")
        assert unknown.value.code == "unknown-action"
    finally:
        await host.registry.aclose()


async def test_the_row_is_committed_before_the_202_is_returned(tmp_path: Path) -> None:
    host, _, _ = await fake_host(tmp_path)
    try:
        answer = await host.admit(host.authenticate(ALICE), make_directive(), bus_op="bus-9")
        assert isinstance(answer, Accepted)
        op_id = answer.handle["operation/id"]
        # A separate connection (another process, after a crash) sees the committed row and its first event.
        with sqlite3.connect(tmp_path / REGISTRY_RELATIVE_PATH) as other:
            row = other.execute(
                "SELECT status, bus_op FROM operations WHERE operation_id = ?", (op_id,)
            ).fetchone()
            events = other.execute(
                "SELECT count(*) FROM status_history WHERE operation_id = ?", (op_id,)
            ).fetchone()
        assert row == ("pending", "bus-9") and events == (1,)
    finally:
        await host.registry.aclose()


async def test_a_row_that_cannot_be_recorded_stops_the_work_and_refuses(tmp_path: Path) -> None:
    host, port, _ = await fake_host(tmp_path)
    try:
        await host.admit(host.authenticate(ALICE), make_directive(), bus_op="taken")
        with pytest.raises(SensoriumError) as refused:
            await host.admit(
                host.authenticate(ALICE), make_directive(), bus_op="taken"
            )  # a new id with a used bus op
        assert refused.value.code == "internal"
        check("sensorium-error.v1", public_refusal(refused.value).to_document())
        assert len(port.stops) == 1 and port.stops[0][2] == "internal"
        assert len(await host.registry.list()) == 1
    finally:
        await host.registry.aclose()


async def test_the_clock_passed_in_is_the_one_used(tmp_path: Path) -> None:
    host, _, _ = await fake_host(tmp_path, clock=ManualClock(T0 + timedelta(days=3)))
    try:
        answer = await host.admit(host.authenticate(ALICE), make_directive())
        assert isinstance(answer, Accepted) and answer.handle["created_at"] == "2027-01-04T12:00:00.000Z"
    finally:
        await host.registry.aclose()
