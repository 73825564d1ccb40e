"""Continuations: exactly-once resume (racing pollers, restarts), failure diagnostics, response modes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from connector.core.policy import DeferredHostPolicy
from connector.errors import SensoriumError
from connector.host.continuations import (
    DeferredResponseMode,
    Resumption,
    StepOutcome,
    bind_result,
    classify_outcome,
    run_step,
)
from connector.host.metrics import HostMetrics
from connector.host.service import HostService
from connector.service.answers import Accepted
from connector.storage.registry import DeferredRegistry
from tests.host.fakes import TOKENS, FakePort, Jitter, fake_host
from tests.host.fakes import directive as make_directive
from tests.host.records import T0
from tests.host.support import check

pytestmark = pytest.mark.asyncio
ALICE = TOKENS["alice"]
REJECT = DeferredResponseMode.REJECT_AS_FAILURE
SURFACE = DeferredResponseMode.SURFACE_TO_CALLER


def continuation(op_id: str | None = None, **extra: Any) -> dict[str, Any]:
    """A JSON-e-Flow-like continuation suspended at step 3."""
    doc: dict[str, Any] = {
        "schema": "orbiplex-continuation.v1",
        "continuation_id": "continuation:flow-1",
        "workflow_run_id": "run:7",
        "resume_kind": "json_e_flow_step",
        "resume_point": {"executor_id": "json_e_flow", "step_index": 3, "output_binding": "sensorium_result"},
        "caller": {"module_id": "test.flow"},
        "capability_id": "sensorium.directive.invoke",
        "context": {"draft": {"lang": "en"}},
        "deadline_at": "2027-01-01T12:15:00Z",
        "attempts": 1,
    }
    if op_id is not None:
        doc["deferred_operation_id"] = op_id
    doc.update(extra)
    return doc


@dataclass
class FlowConsumer:
    """A two-step flow: step 3 calls the capability; step 4 reads the bound result. Records every resume."""

    resumed: list[Resumption] = field(default_factory=list)
    step_four_inputs: list[Any] = field(default_factory=list)

    async def hook(self, resumption: Resumption) -> None:
        self.resumed.append(resumption)
        if resumption.resumed:
            binding = resumption.continuation["resume_point"]["output_binding"]
            self.step_four_inputs.append(resumption.continuation["context"][binding])
        await anyio.lowlevel.checkpoint()  # a real flow would await its next step here


async def _suspended(host: HostService, port: FakePort, action: str = "whisper.redaction.prepare") -> str:
    outcome = await run_step(host, ALICE, make_directive(action), continuation())
    assert outcome.kind == "deferred"
    op_id = str(outcome.value["operation/id"])
    port.ops[op_id].status = "running"
    return op_id


def _complete(port: FakePort, op_id: str) -> None:
    port.ops[op_id].status = "completed"


async def test_a_completed_operation_resumes_once_with_the_result_bound(tmp_path: Path) -> None:
    host, port, _ = await fake_host(tmp_path)
    flow = FlowConsumer()
    try:
        await host.continuations.install(flow.hook)
        op_id = await _suspended(host, port)
        record = await host.registry.get(op_id)
        assert record is not None and record.continuation_digest is not None
        await host.poll_due(T0 + timedelta(seconds=1))
        assert flow.resumed == []
        _complete(port, op_id)
        await host.poll_due(T0 + timedelta(seconds=5))
        await host.poll_due(T0 + timedelta(seconds=60))
    finally:
        await host.registry.aclose()
    assert len(flow.resumed) == 1
    resumed = flow.resumed[0]
    assert resumed.operation_id == op_id and resumed.status == "completed" and resumed.resumed
    assert flow.step_four_inputs == [{"json": ""}]  # the completed status's `result`
    assert resumed.continuation["context"]["draft"] == {"lang": "en"}  # the rest of the context is kept
    assert resumed.continuation["deferred_operation_id"] == op_id
    check("orbiplex-continuation.v1", dict(resumed.continuation))
    assert host.metrics.count("sensorium_host_continuations", label="resumed") == 1


async def test_racing_pollers_on_two_connections_resume_exactly_once(tmp_path: Path) -> None:
    host, port, clock = await fake_host(tmp_path)
    flow = FlowConsumer()
    second_registry = await DeferredRegistry.open(tmp_path)
    rival = HostService(
        port, second_registry, DeferredHostPolicy(), clock, Jitter(0.0), metrics=HostMetrics()
    )
    try:
        await host.continuations.install(flow.hook)
        await rival.continuations.install(flow.hook)
        op_ids = [await _suspended(host, port) for _ in range(3)]
        for op_id in op_ids:
            _complete(port, op_id)
        stale = [await host.registry.get(op_id) for op_id in op_ids]
        async with anyio.create_task_group() as group:
            for record in stale:
                assert record is not None
                for poller in (host, rival, host, rival, host):
                    group.start_soon(poller.poll, record, T0 + timedelta(seconds=2))
            group.start_soon(host.poll_due, T0 + timedelta(seconds=2))
            group.start_soon(rival.poll_due, T0 + timedelta(seconds=2))
    finally:
        await second_registry.aclose()
        await host.registry.aclose()
    assert sorted(r.operation_id for r in flow.resumed) == sorted(op_ids)


async def test_a_restart_between_completion_and_resume_resumes_once(tmp_path: Path) -> None:
    host, port, clock = await fake_host(tmp_path)
    op_id = await _suspended(host, port)
    _complete(port, op_id)
    # The host records the end, but dies before any flow hook runs (none was installed).
    await host.poll_due(T0 + timedelta(seconds=1))
    await host.registry.aclose()
    for round_ in range(2):
        flow = FlowConsumer()
        again, _, _ = await fake_host(tmp_path, port=port, clock=clock)
        try:
            await again.recover(T0 + timedelta(seconds=2))
            await again.continuations.install(flow.hook)
            await again.continuations.settle_pending()
        finally:
            await again.registry.aclose()
        assert len(flow.resumed) == (1 if round_ == 0 else 0)


async def test_a_crash_after_the_terminal_commit_still_resumes_after_restart(tmp_path: Path) -> None:
    host, port, clock = await fake_host(tmp_path)
    flow = FlowConsumer()
    await host.continuations.install(flow.hook)
    op_id = await _suspended(host, port)
    _complete(port, op_id)
    record = await host.registry.get(op_id)
    assert record is not None
    # Simulate the crash: the status commit lands, the listener never runs.
    await host.registry.record_status(
        op_id,
        status="completed",
        metadata=dict(record.metadata),
        now=T0,
        retry_after_seconds=None,
        next_poll_at=None,
        notify=False,
    )
    await host.registry.aclose()
    assert flow.resumed == []
    again, _, _ = await fake_host(tmp_path, port=port, clock=clock)
    try:
        await again.continuations.install(flow.hook)
    finally:
        await again.registry.aclose()
    assert [r.operation_id for r in flow.resumed] == [op_id]


async def test_other_terminal_statuses_fail_the_flow_with_a_deferred_operation_diagnostic(
    tmp_path: Path,
) -> None:
    host, port, _ = await fake_host(tmp_path)
    flow = FlowConsumer()
    try:
        await host.continuations.install(flow.hook)
        failed, gone = await _suspended(host, port), await _suspended(host, port)
        port.ops[failed].status = "failed"
        port.ops[failed].extra = {"error": {"code": "command-failed", "message": "m"}}
        del port.ops[gone]
        await host.poll_due(T0 + timedelta(seconds=1))
    finally:
        await host.registry.aclose()
    by_id = {r.operation_id: r for r in flow.resumed}
    assert set(by_id) == {failed, gone}
    failed_diagnostic = by_id[failed].diagnostic
    assert not by_id[failed].resumed and failed_diagnostic is not None
    assert failed_diagnostic["code"] == "deferred-operation" and failed_diagnostic["status"] == "failed"
    gone_diagnostic = by_id[gone].diagnostic
    assert gone_diagnostic is not None and gone_diagnostic["status"] == "unknown"
    assert "sensorium_result" not in by_id[failed].continuation["context"]
    assert flow.step_four_inputs == []
    assert host.metrics.count("sensorium_host_continuations", label="failed") == 2


async def test_a_result_the_connector_no_longer_holds_fails_the_flow(tmp_path: Path) -> None:
    host, port, _ = await fake_host(tmp_path)
    flow = FlowConsumer()
    try:
        op_id = await _suspended(host, port)
        _complete(port, op_id)
        await host.poll_due(T0 + timedelta(seconds=1))  # recorded completed; no hook yet
        del port.ops[op_id]  # the connector restarted and lost the result
        await host.continuations.install(flow.hook)
    finally:
        await host.registry.aclose()
    assert len(flow.resumed) == 1 and flow.resumed[0].diagnostic is not None
    assert flow.resumed[0].diagnostic["code"] == "result-unavailable"


async def test_suspending_after_the_end_settles_at_once(tmp_path: Path) -> None:
    host, port, _ = await fake_host(tmp_path)
    flow = FlowConsumer()
    try:
        await host.continuations.install(flow.hook)
        answer = await host.admit(host.authenticate(ALICE), make_directive("whisper.redaction.prepare"))
        assert isinstance(answer, Accepted)
        op_id = str(answer.handle["operation/id"])
        _complete(port, op_id)
        await host.poll_due(T0 + timedelta(seconds=1))  # ends before the flow got to suspend
        assert flow.resumed == []
        await host.continuations.suspend(op_id, continuation(op_id))
        await host.continuations.suspend(op_id, continuation(op_id))  # a second suspend hands out nothing
    finally:
        await host.registry.aclose()
    assert len(flow.resumed) == 1 and flow.resumed[0].resumed


async def test_a_malformed_or_foreign_continuation_is_refused_without_values(tmp_path: Path) -> None:
    host, _port, _ = await fake_host(tmp_path)
    try:
        answer = await host.admit(host.authenticate(ALICE), make_directive("whisper.redaction.prepare"))
        assert isinstance(answer, Accepted)
        op_id = str(answer.handle["operation/id"])
        bad = continuation(op_id, resume_point={"executor_id": "CANARY-cont-1"})
        with pytest.raises(SensoriumError) as refused:
            await host.continuations.suspend(op_id, bad)
        assert refused.value.code == "invalid-input" and "CANARY" not in json.dumps(
            refused.value.to_document()
        )
        other = continuation("deferred:sensorium.directive.invoke:" + "B" * 26)
        with pytest.raises(SensoriumError):
            await host.continuations.suspend(op_id, other)
        record = await host.registry.get(op_id)
        assert record is not None and record.continuation_digest is None
    finally:
        await host.registry.aclose()


async def test_reject_as_failure_refuses_deferred_outcomes_and_cancels_the_work(tmp_path: Path) -> None:
    host, port, _ = await fake_host(tmp_path)
    try:
        outcome = await run_step(
            host, ALICE, make_directive("whisper.redaction.prepare"), continuation(), REJECT
        )
        assert outcome.kind == "failed" and outcome.diagnostic is not None
        assert outcome.diagnostic["code"] == "deferred-not-accepted"
        op_id = outcome.diagnostic["operation/id"]
        assert port.cancels == [op_id]  # bridged: the handle had a cancel_href
        record = await host.registry.get(op_id)
        assert record is not None and record.continuation_digest is None
        port.next_handle = {"cancel/unavailable-reason": "cannot stop"}
        stubborn = await run_step(
            host, ALICE, make_directive("whisper.redaction.prepare"), continuation(), REJECT
        )
        assert stubborn.kind == "failed" and port.cancels == [op_id]  # no cancel surface, no cancel
    finally:
        await host.registry.aclose()


async def test_surface_to_caller_suspends_with_the_operation_and_its_expiry(tmp_path: Path) -> None:
    host, port, _ = await fake_host(tmp_path)
    template = continuation()
    del template["deadline_at"]
    try:
        outcome = await run_step(host, ALICE, make_directive("whisper.redaction.prepare"), template)
        assert outcome.kind == "deferred"
        check("deferred-operation.v1", dict(outcome.value))
        flow = FlowConsumer()
        await host.continuations.install(flow.hook)
        op_id = outcome.value["operation/id"]
        _complete(port, op_id)
        await host.poll_due(T0 + timedelta(seconds=1))
    finally:
        await host.registry.aclose()
    stored = flow.resumed[0].continuation
    assert stored["deferred_operation_id"] == op_id and stored["deadline_at"] == outcome.value["expires_at"]


@pytest.mark.parametrize(
    ("body", "mode", "kind", "code"),
    [
        ({"schema": "deferred-operation.v1", "operation/id": "x"}, SURFACE, "deferred", None),
        ({"schema": "deferred-operation.v1", "operation/id": "x"}, REJECT, "failed", "deferred-not-accepted"),
        ({"schema": "deferred-operation-status.v1", "status": "pending"}, SURFACE, "deferred", None),
        (
            {"schema": "deferred-operation-status.v2", "status": "running"},
            REJECT,
            "failed",
            "deferred-not-accepted",
        ),
        (
            {"schema": "deferred-operation-status.v1", "status": "completed", "result": {"json": 1}},
            REJECT,
            "completed",
            None,
        ),
        (
            {
                "schema": "deferred-operation-status.v1",
                "status": "expired",
                "error": {"code": "deadline-exceeded"},
            },
            SURFACE,
            "failed",
            "deferred-operation",
        ),
        (
            {"schema": "sensorium-directive-result.v1", "status": "completed", "result": {"json": 2}},
            REJECT,
            "completed",
            None,
        ),
        (
            {
                "schema": "sensorium-directive-result.v1",
                "status": "failed",
                "error": {"code": "command-failed"},
            },
            SURFACE,
            "failed",
            "command-failed",
        ),
        (
            {"schema": "sensorium-error.v1", "code": "forbidden", "message": "m"},
            SURFACE,
            "failed",
            "forbidden",
        ),
        ({"schema": "deferred-operation-status.v1", "status": "dozing"}, SURFACE, "failed", "internal"),
    ],
)
async def test_classify_outcome(
    body: dict[str, Any], mode: DeferredResponseMode, kind: str, code: str | None
) -> None:
    outcome = classify_outcome(body, mode)
    assert outcome.kind == kind
    assert (outcome.diagnostic or {}).get("code") == code
    if kind == "completed":
        assert outcome == StepOutcome("completed", body["result"])


async def test_bind_result_puts_the_value_under_the_output_binding() -> None:
    bound = bind_result(continuation("deferred:sensorium.directive.invoke:" + "C" * 26), {"json": [1, 2]})
    assert bound["context"] == {"draft": {"lang": "en"}, "sensorium_result": {"json": [1, 2]}}
