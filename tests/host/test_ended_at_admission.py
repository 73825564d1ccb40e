"""Operations already over when the host records them (CONTRACT §11): concluded like any other."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from connector.assembly import Assembled
from connector.core.clock import format_time, wall_clock
from connector.host.continuations import Resumption, run_step
from connector.storage.registry import OperationRecord
from tests.host.support import EndsBeforeTheHostLooks, add_principals, check, host_app
from tests.support.directives import command_directive, scan_directive
from tests.support.principals import bearer

pytestmark = [pytest.mark.asyncio, pytest.mark.realtime]  # realtime: command subprocesses
CONTEXT = {"operation/id": "flow-step-3", "trace/id": "trace-1"}


def no_window_scan() -> dict[str, Any]:
    """A 30 s scan whose deadline (5 s ahead) leaves no window: cleanup 4000 ms + the 1 s proof (§3)."""
    deadline = format_time(wall_clock() + timedelta(seconds=5))
    return scan_directive(30, timing={"deadline_at": deadline}, extra={"causal/context": CONTEXT})


def quick_command() -> dict[str, Any]:
    """A command whose program ends at once."""
    return command_directive(
        "whisper.redaction.prepare", input={"text": "hello"}, extra={"causal/context": CONTEXT}
    )


def ending_during_admission(assembled: Assembled) -> None:
    """The host's port answers each admission only once the admitted work ended."""
    assembled.host.port = EndsBeforeTheHostLooks(assembled.service)


def versions(registry_path: Path, op_id: str) -> tuple[int, int | None]:
    """The row's `version` and `terminal_version` (the registry sets the latter on the terminal change)."""
    with sqlite3.connect(f"{registry_path.as_uri()}?mode=ro", uri=True) as db:
        row = db.execute(
            "SELECT version, terminal_version FROM operations WHERE operation_id = ?", (op_id,)
        ).fetchone()
    return int(row[0]), row[1]


async def concluded(assembled: Assembled, op_id: str, status: str) -> OperationRecord:
    """The row is terminal, nothing is due, the history ends with the terminal status, one outcome counted."""
    host = assembled.host
    record = await host.registry.get(op_id)
    assert record is not None and record.status == status
    assert record.next_poll_at is None and record.retry_after_seconds is None
    assert await host.registry.due(wall_clock() + timedelta(days=1)) == []
    version, terminal_version = versions(host.registry.path, op_id)
    assert terminal_version == version
    history = [event.status for event in await host.registry.history(op_id)]
    assert history == ["pending", status]
    assert host.metrics.count("sensorium_host_terminal_outcomes", label=status) == 1
    return record


@pytest.mark.parametrize(
    ("directive", "status"), [(no_window_scan, "completed"), (quick_command, "completed")]
)
async def test_the_host_route_concludes_work_that_ended_during_admission(
    tmp_path: Path, directive: Any, status: str
) -> None:
    tokens = add_principals(tmp_path)
    async with host_app(tmp_path, host_poller=False) as (assembled, client):
        ending_during_admission(assembled)
        accepted = await client.post("/v1/host/directives", json=directive(), headers=bearer(tokens.alice))
        assert accepted.status_code == 202, accepted.text
        handle = accepted.json()
        check("deferred-operation.v1", handle)
        op_id = handle["operation/id"]
        await concluded(assembled, op_id, status)
        detail = await client.get(f"/v1/admin/deferred-operations/{op_id}", headers=bearer(tokens.operator))
        receipt = detail.json()["receipt"]
        check("execution-receipt.v1", receipt)
        assert receipt["status"] == status and receipt["causal/context"] == CONTEXT
        answer = (await client.get(handle["status_href"], headers=bearer(tokens.alice))).json()
        assert answer["status"] == status and "retry_after_seconds" not in answer
        if answer["schema"] == "deferred-operation-status.v2":
            assert answer["result"]["reason"] == "deadline-reached"
            assert answer["cleanup"] == {"state": "confirmed", "claim": "released"}


@pytest.mark.parametrize("directive", [no_window_scan, quick_command])
async def test_a_flow_suspended_on_work_that_ended_during_admission_resumes_once(
    tmp_path: Path, directive: Any
) -> None:
    tokens = add_principals(tmp_path)
    resumed: list[Resumption] = []
    continuation = {
        "schema": "orbiplex-continuation.v1",
        "continuation_id": "continuation:flow-1",
        "resume_kind": "json_e_flow_step",
        "resume_point": {"executor_id": "json_e_flow", "step_index": 3, "output_binding": "found"},
        "caller": {"module_id": "test.flow"},
        "capability_id": "sensorium.directive.invoke",
        "attempts": 1,
    }
    async with host_app(tmp_path, host_poller=False) as (assembled, _client):
        ending_during_admission(assembled)
        await assembled.host.continuations.install(resumed.append)
        outcome = await run_step(assembled.host, tokens.alice, directive(), continuation)
        assert outcome.kind == "deferred"
        op_id = outcome.value["operation/id"]
        await concluded(assembled, op_id, "completed")
        await assembled.host.poll_due(wall_clock() + timedelta(days=1))
        await assembled.host.continuations.settle_pending()
    assert [(r.operation_id, r.resumed) for r in resumed] == [(op_id, True)]
    assert "found" in resumed[0].continuation["context"]
    assert assembled.host.metrics.count("sensorium_host_continuations", label="resumed") == 1
