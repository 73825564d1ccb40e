"""The command runner: sync and async runs, bounds, failures, cancellation, recovery, replays."""

from __future__ import annotations

import base64
import json
import os
import platform
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from connector.core.clock import format_time
from connector.core.commands import CommandAction
from connector.errors import SensoriumError
from connector.runtime.commands import CommandRunner
from connector.storage.state import STATE_RELATIVE_PATH, CommandOperation, ConnectorState
from connector.timer import VirtualTimer
from tests.runtime.commands.conftest import (
    answered,
    cancel_status,
    check_status_shape,
    contract_violations,
    pid_alive,
    program_action,
    running,
    status_of,
    sync_call,
    virtual_now,
    wait_for_file,
    wait_terminal,
)

OP = "deferred:sensorium.directive.invoke:"
REDACT = CommandAction(
    action_id="whisper.redaction.prepare",
    argv=("python3", "-m", "connector.actions.redact"),
    timeout_ms=10000,
    cancel="terminate",
    input="stdin-json",
    execution_mode_support="either",
    retry_after_seconds=1,
    preferred_max_ttl_seconds=120,
)
OS_INFO = CommandAction(
    action_id="sensorium.os.info", argv=("uname", "-srm"), timeout_ms=2000, cancel="none", input="none"
)


def op_id(n: int) -> str:
    """A well-formed operation id (26 base32 characters) numbered n."""
    return OP + base64.b32encode(n.to_bytes(16, "big")).decode().rstrip("=")


def now() -> datetime:
    return datetime.now(UTC)


def db_bytes(data: Path) -> bytes:
    db = data / STATE_RELATIVE_PATH
    return b"".join(p.read_bytes() for p in db.parent.iterdir() if p.name.startswith(db.name))


@pytest.mark.asyncio
@pytest.mark.realtime  # real command processes
async def test_os_info_sync(tmp_path: Path) -> None:
    async with running(tmp_path) as (state, runner):
        doc = await runner.submit(op_id(1), "alice", OS_INFO, {}, "sync", now())
        expected = f"{platform.system()} {platform.release()} {platform.machine()}"
        assert doc == {
            "schema": "sensorium-directive-result.v1",
            "action_id": "sensorium.os.info",
            "status": "completed",
            "result": {"json": expected},
            "diagnostics": [],
        }
        contract_violations("sensorium-directive-result.v1", doc)
        stored = await state.get_operation(op_id(1))
        assert stored is not None and stored.mode == "sync" and stored.status == "completed"
        assert not stored.cancelable


@pytest.mark.asyncio
@pytest.mark.realtime  # real command processes
async def test_redact_sync_through_the_python_alias(tmp_path: Path) -> None:
    text = {"text": "write to jane@example.org or call +49 30 1234567"}
    async with running(tmp_path) as (state, runner):
        doc = await runner.submit(op_id(2), "alice", REDACT, text, "sync", now())
        assert doc["status"] == "completed"
        assert doc["result"]["json"] == {
            "text": "write to [email] or call [phone]",
            "redactions": {"email": 1, "phone": 1},
        }
        stored = await state.get_operation(op_id(2))
        assert stored is not None and stored.input_json is None  # cleared at the terminal state
    assert b"jane@example.org" not in db_bytes(tmp_path)


@pytest.mark.asyncio
@pytest.mark.realtime  # real command processes
async def test_redact_async_handle_polls_and_result(tmp_path: Path) -> None:
    causal = {"operation/id": "flow-1", "trace/id": "t-9"}
    async with running(tmp_path) as (state, runner):
        start = now()
        handle = await runner.submit(
            op_id(3), "alice", REDACT, {"text": "a@b.io"}, "async", start, causal_context=causal
        )
        assert handle == {
            "schema": "sensorium-connector-deferred.v1",
            "connector_operation/id": op_id(3),
            "action_id": "whisper.redaction.prepare",
            "retry_after_seconds": 1,
            "fail_after_seconds": 120,
            "status_path": f"/v1/operations/{op_id(3)}",
            "cancel_path": f"/v1/operations/{op_id(3)}/cancel",
            "diagnostics": [],
        }
        contract_violations("sensorium-connector-deferred.v1", handle)
        final = await wait_terminal(runner, op_id(3))
        assert final["status"] == "completed"
        assert final["result"] == {"json": {"text": "[email]", "redactions": {"email": 1, "phone": 0}}}
        assert final["causal/context"] == causal
        assert final["expires_at"] == format_time(start + timedelta(seconds=120))
        assert final["expires_at"].endswith("Z")
        stored = await state.get_operation(op_id(3))
        assert stored is not None and stored.input_json is None


@pytest.mark.asyncio
@pytest.mark.realtime  # real command processes
async def test_stdin_json_reaches_the_program_and_none_gets_no_stdin(tmp_path: Path) -> None:
    echo = program_action("echo", input="stdin-json")
    async with running(tmp_path) as (_, runner):
        doc = await runner.submit(op_id(4), "alice", echo, {"b": [1, 2], "a": "é"}, "sync", now())
        assert doc["result"]["json"] == {"got": {"a": "é", "b": [1, 2]}}
        with pytest.raises(SensoriumError) as refused:
            await runner.submit(op_id(5), "alice", OS_INFO, {"unexpected": "CANARY"}, "sync", now())
        assert refused.value.code == "invalid-input"
        assert "CANARY" not in str(refused.value.to_document())
        assert await runner.operation(op_id(5)) is None  # refused before any row or process


@pytest.mark.asyncio
async def test_mode_is_checked_before_anything_runs(tmp_path: Path) -> None:
    async with running(tmp_path) as (_, runner):
        with pytest.raises(SensoriumError) as refused:
            await runner.submit(op_id(6), "alice", OS_INFO, {}, "async", now())
        assert refused.value.code == "execution-mode-not-supported"
        assert await runner.operation(op_id(6)) is None


@pytest.mark.asyncio
@pytest.mark.realtime  # real command processes
async def test_failure_is_stable_and_never_echoes_stderr(tmp_path: Path) -> None:
    canary = "CANARY-STDERR-77c1"
    async with running(tmp_path) as (_, runner):
        doc = await runner.submit(op_id(7), "alice", program_action("fail", canary), {}, "sync", now())
        assert doc["status"] == "failed"
        assert doc["error"]["code"] == "command-failed"
        handle = await runner.submit(op_id(8), "alice", program_action("fail", canary), {}, "async", now())
        final = await wait_terminal(runner, handle["connector_operation/id"])
        assert final["status"] == "failed" and final["error"]["code"] == "command-failed"
        assert canary not in json.dumps([doc, final])
    assert canary.encode() not in db_bytes(tmp_path)


@pytest.mark.asyncio
async def test_spawn_failure_is_command_failed(tmp_path: Path) -> None:
    missing = CommandAction("x.missing", ("/nonexistent/program",), 1000, "none", "none")
    async with running(tmp_path) as (_, runner):
        doc = await runner.submit(op_id(9), "alice", missing, {}, "sync", now())
    assert doc["status"] == "failed" and doc["error"]["code"] == "command-failed"


@pytest.mark.asyncio
@pytest.mark.realtime  # a real process; its budget is on the virtual timer
async def test_timeout_terminates_and_reports_timed_out(tmp_path: Path) -> None:
    marker = tmp_path / "slept.pid"
    sleeper = program_action("sleep", str(marker), "30", timeout_ms=2000)
    timer = VirtualTimer()
    async with running(tmp_path, timer=timer) as (state, runner), anyio.create_task_group() as tg:
        answers: list[dict[str, Any]] = []
        tg.start_soon(sync_call, runner, answers, op_id(10), sleeper, virtual_now(timer))
        await wait_for_file(marker)
        await timer.advance(1999)
        assert answers == [] and (await status_of(runner, op_id(10)))["status"] == "running"
        await timer.advance(1)
        doc = await answered(answers)
        assert doc["status"] == "failed" and doc["error"]["code"] == "deadline-exceeded"
        stored = await state.get_operation(op_id(10))
        assert stored is not None and stored.status == "timed-out"
        assert not pid_alive(int(marker.read_text()))
        status = await status_of(runner, op_id(10))
        check_status_shape(status)
        assert status["status"] == "timed-out" and status["error"]["code"] == "deadline-exceeded"


@pytest.mark.asyncio
@pytest.mark.realtime  # a real process; its budget is on the virtual timer
async def test_directive_timeout_narrows_the_catalog_budget(tmp_path: Path) -> None:
    marker = tmp_path / "slept.pid"
    sleeper = program_action("sleep", str(marker), "30", timeout_ms=20000)
    timer = VirtualTimer()
    async with running(tmp_path, timer=timer) as (_, runner), anyio.create_task_group() as tg:
        answers: list[dict[str, Any]] = []
        tg.start_soon(
            partial(sync_call, runner, answers, op_id(11), sleeper, virtual_now(timer), timeout_ms=300)
        )
        await wait_for_file(marker)
        await timer.advance(299)
        assert answers == []
        await timer.advance(1)
        assert (await answered(answers))["error"]["code"] == "deadline-exceeded"


@pytest.mark.asyncio
@pytest.mark.realtime  # a real process; its expiry is on the virtual timer
async def test_expiry_ends_running_work(tmp_path: Path) -> None:
    marker = tmp_path / "slept.pid"
    sleeper = program_action("sleep", str(marker), "30")
    timer = VirtualTimer()
    async with running(tmp_path, timer=timer) as (_, runner):
        start = virtual_now(timer)
        handle = await runner.submit(
            op_id(12), "alice", sleeper, {}, "async", start, expires_at=start + timedelta(milliseconds=2500)
        )
        assert handle["fail_after_seconds"] == 3
        await wait_for_file(marker)
        await timer.advance(2499)
        assert (await status_of(runner, op_id(12)))["status"] == "running"
        await timer.advance(1)
        final = await wait_terminal(runner, op_id(12))
        assert final["status"] == "expired"
        assert final["error"]["code"] == "expired"
        assert not pid_alive(int(marker.read_text()))


@pytest.mark.asyncio
@pytest.mark.realtime  # real command processes
async def test_output_bound(tmp_path: Path) -> None:
    async with running(tmp_path, max_output_bytes=4096) as (_, runner):
        doc = await runner.submit(op_id(13), "alice", program_action("flood", "1000000"), {}, "sync", now())
        assert doc["status"] == "failed" and doc["error"]["code"] == "response-too-large"
        ok = await runner.submit(op_id(14), "alice", program_action("flood", "1000"), {}, "sync", now())
        assert ok["status"] == "completed" and len(ok["result"]["json"]) == 501
        # A chatty stderr neither blocks the program nor counts against the bound.
        noisy = await runner.submit(
            op_id(15), "alice", program_action("stderr-flood", "500000"), {}, "sync", now()
        )
        assert noisy["result"]["json"] == {"ok": True}


@pytest.mark.asyncio
@pytest.mark.realtime  # real command processes
async def test_output_that_is_not_json(tmp_path: Path) -> None:
    async with running(tmp_path) as (_, runner):
        nan = await runner.submit(op_id(16), "alice", program_action("nan"), {}, "sync", now())
        assert nan["result"]["json"] == "NaN"
        binary = await runner.submit(op_id(17), "alice", program_action("binary"), {}, "sync", now())
        assert binary["status"] == "failed" and binary["error"]["code"] == "command-failed"


@pytest.mark.asyncio
@pytest.mark.realtime  # real command processes
async def test_concurrency_is_bounded_and_queued_work_cancels_at_once(tmp_path: Path) -> None:
    markers = [tmp_path / f"m{i}.pid" for i in range(3)]
    moves: list[tuple[str, str]] = []

    def listener(event: str, operation: CommandOperation) -> None:
        moves.append((operation.operation_id, event))

    async with running(tmp_path, max_workers=2, listener=listener) as (_, runner):
        for i, marker in enumerate(markers):
            await runner.submit(
                op_id(20 + i), "alice", program_action("sleep", str(marker), "30"), {}, "async", now()
            )
        await wait_for_file(markers[0])
        await wait_for_file(markers[1])
        assert (await status_of(runner, op_id(20)))["status"] == "running"
        queued = await status_of(runner, op_id(22))
        check_status_shape(queued)
        assert queued["status"] == "pending" and queued["retry_after_seconds"] == 1
        with anyio.fail_after(10):
            cancelled = await cancel_status(runner, op_id(22))
        check_status_shape(cancelled)
        assert cancelled["status"] == "cancelled" and "error" not in cancelled
        for i in (20, 21):
            assert (await cancel_status(runner, op_id(i)))["status"] == "cancelled"
    # The runner is closed: the cancelled queued work never ran, and never will.
    assert [event for op, event in moves if op == op_id(22)] == ["admitted", "ended"]
    assert not markers[2].exists()


@pytest.mark.asyncio
@pytest.mark.realtime  # real command processes
async def test_cancel_running_sigterm(tmp_path: Path) -> None:
    marker = tmp_path / "m.pid"
    async with running(tmp_path, kill_after_seconds=25) as (state, runner):
        await runner.submit(
            op_id(30), "alice", program_action("sleep", str(marker), "30"), {}, "async", now()
        )
        pid = int(await wait_for_file(marker))
        started = time.monotonic()
        doc = await cancel_status(runner, op_id(30))
        assert time.monotonic() - started < 12  # SIGTERM was enough: no wait for the SIGKILL bound (25 s)
        assert doc["status"] == "cancelled"
        assert not pid_alive(pid)
        stored = await state.get_operation(op_id(30))
        assert stored is not None and stored.status == "cancelled"


@pytest.mark.asyncio
@pytest.mark.realtime  # a real process that ignores SIGTERM; the grace period is on the virtual timer
async def test_cancel_running_program_ignoring_sigterm_gets_sigkill(tmp_path: Path) -> None:
    marker = tmp_path / "m.pid"
    timer = VirtualTimer()
    async with (
        running(tmp_path, kill_after_seconds=0.5, timer=timer) as (_, runner),
        anyio.create_task_group() as tg,
    ):
        await runner.submit(
            op_id(31), "alice", program_action("ignore-term", str(marker)), {}, "async", virtual_now(timer)
        )
        pid = int(await wait_for_file(marker))
        answers: list[dict[str, Any]] = []

        async def cancel() -> None:
            answers.append(await cancel_status(runner, op_id(31)))

        tg.start_soon(cancel)
        await wait_for_file(Path(f"{marker}.term"))  # SIGTERM arrived: the grace period runs from now
        await timer.advance(499)
        assert answers == [] and pid_alive(pid), "it survives SIGTERM for the whole grace period"
        await timer.advance(1)
        doc = await answered(answers)  # SIGKILL, and the exit was seen
        assert doc["status"] == "cancelled"
        assert not pid_alive(pid)
        # A terminal operation answers its unchanged status.
        assert await runner.cancel(op_id(31)) == (False, doc)


@pytest.mark.asyncio
@pytest.mark.realtime  # real command processes
async def test_not_cancelable(tmp_path: Path) -> None:
    marker = tmp_path / "m.pid"
    action = program_action("sleep", str(marker), "0.5", cancel="none")
    async with running(tmp_path) as (_, runner):
        handle = await runner.submit(op_id(32), "alice", action, {}, "async", now())
        assert "cancel_path" not in handle
        assert handle["cancel/unavailable-reason"]
        contract_violations("sensorium-connector-deferred.v1", handle)
        await wait_for_file(marker)
        with pytest.raises(SensoriumError) as refused:
            await runner.cancel(op_id(32))  # refused: not an answer
        assert refused.value.code == "not-cancelable" and refused.value.http_status == 409
        final = await wait_terminal(runner, op_id(32))
        assert final["status"] == "completed" and final["result"]["json"] == {"slept": True}
        assert (await cancel_status(runner, op_id(32)))["status"] == "completed"


@pytest.mark.asyncio
async def test_unknown_operation(tmp_path: Path) -> None:
    async with running(tmp_path) as (_, runner):
        assert await runner.status(op_id(99)) is None
        assert await runner.status(op_id(99), wait_s=5.0) is None
        assert await runner.cancel(op_id(99)) is None
        assert await runner.observe(op_id(99)) is None


@pytest.mark.asyncio
@pytest.mark.realtime  # real command processes
async def test_sync_caller_going_away_terminates_the_program(tmp_path: Path) -> None:
    marker = tmp_path / "m.pid"
    async with running(tmp_path) as (state, runner):
        action = program_action("ignore-term", str(marker))
        async with anyio.create_task_group() as caller:
            caller.start_soon(runner.submit, op_id(40), "alice", action, {}, "sync", now())
            pid = int(await wait_for_file(marker))
            caller.cancel_scope.cancel()  # the HTTP client went away
        assert not pid_alive(pid)
        stored = await state.get_operation(op_id(40))
        assert stored is not None and stored.status == "cancelled" and stored.input_json is None


@pytest.mark.asyncio
@pytest.mark.realtime  # real command processes
async def test_replays_answer_exactly_as_the_first_time(tmp_path: Path) -> None:
    async with running(tmp_path) as (_, runner):
        first = await runner.submit(op_id(41), "alice", REDACT, {"text": "x"}, "async", now())
        await wait_terminal(runner, op_id(41))
        assert await runner.replay(op_id(41), REDACT) == first
        sync_first = await runner.submit(op_id(42), "alice", OS_INFO, {}, "sync", now())
        assert await runner.replay(op_id(42), OS_INFO) == sync_first
        with pytest.raises(SensoriumError) as duplicate:
            await runner.submit(op_id(42), "alice", OS_INFO, {}, "sync", now())
        assert duplicate.value.code == "internal"


@pytest.mark.asyncio
@pytest.mark.realtime  # real command processes
async def test_runner_shutdown_marks_running_work_interrupted(tmp_path: Path) -> None:
    marker = tmp_path / "m.pid"
    async with await ConnectorState.open(tmp_path) as state:
        async with CommandRunner(state, kill_after_seconds=0.3) as runner:
            await runner.submit(
                op_id(43), "alice", program_action("sleep", str(marker), "30"), {}, "async", now()
            )
            pid = int(await wait_for_file(marker))
        assert not pid_alive(pid)
        stored = await state.get_operation(op_id(43))
        assert stored is not None and stored.status == "failed"
        assert stored.error_code == "interrupted-by-restart"


@pytest.mark.asyncio
@pytest.mark.realtime  # real command processes
async def test_purge_forgets_old_terminal_rows(tmp_path: Path) -> None:
    async with running(tmp_path) as (_, runner):
        await runner.submit(op_id(44), "alice", OS_INFO, {}, "sync", now())
        assert await runner.purge(now()) == 0
        assert await runner.purge(now() + timedelta(days=8)) == 1
        assert await runner.status(op_id(44)) is None


CRASHING_HOST = """
import sys, anyio
from datetime import UTC, datetime
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from connector.storage.state import ConnectorState
from connector.runtime.commands import CommandRunner
from tests.runtime.commands.conftest import program_action
from tests.runtime.commands.test_runner import REDACT, OS_INFO, op_id

async def main():
    data, marker = Path(sys.argv[1]), sys.argv[2]
    async with await ConnectorState.open(data) as state, CommandRunner(state) as runner:
        now = datetime.now(UTC)
        await runner.submit(op_id(50), "alice", OS_INFO, {}, "sync", now)
        await runner.submit(op_id(51), "alice", program_action("sleep", marker, "60"), {}, "async", now)
        await runner.submit(op_id(52), "alice", REDACT, {"text": "queued CANARY-Q"}, "async", now)
        print("submitted", flush=True)
        await anyio.sleep(120)  # real peer: the scripted program's own run time (killed -9)

anyio.run(main)
"""


@pytest.mark.asyncio
@pytest.mark.realtime  # real command processes
async def test_restart_recovery_after_kill_9(tmp_path: Path, repo_root: Path) -> None:
    data, marker = tmp_path / "data", tmp_path / "m.pid"
    host = subprocess.Popen(
        [sys.executable, "-c", CRASHING_HOST, str(data), str(marker), str(repo_root)],
        stdout=subprocess.PIPE,
        cwd=repo_root,
    )
    try:
        child = int(await wait_for_file(marker, timeout=30))
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait(timeout=30)
        assert host.stdout is not None
        host.stdout.close()
    os.kill(child, signal.SIGKILL)  # an orphan of the killed host; a supervisor would reap its group
    async with running(data) as (state, runner):
        before = {op.operation_id: op.status for op in await state.list_operations()}
        assert before[op_id(50)] == "completed" and before[op_id(51)] == "running"
        assert before[op_id(52)] in ("pending", "running", "completed")
        interrupted = await runner.recover(now())
        assert op_id(51) in interrupted and op_id(50) not in interrupted
        status = await status_of(runner, op_id(51))
        check_status_shape(status)
        assert status["status"] == "failed" and status["error"]["code"] == "interrupted-by-restart"
        assert all(op.input_json is None for op in await state.list_operations())
        finished = await runner.replay(op_id(50), OS_INFO)
        assert finished["status"] == "completed" and finished["result"]["json"].startswith(platform.system())
        assert await runner.recover(now()) == []
    if before[op_id(52)] != "completed":
        # Interrupted work keeps no input. (A completed redaction legitimately stores its result text.)
        assert b"CANARY-Q" not in db_bytes(data)
