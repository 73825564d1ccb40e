"""One runtime interface for both kinds: the same questions, None for an id a runtime does not hold."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest

from connector.runtime.kinds import CommandRuntime, DiscoveryRuntime, OperationRuntime, operation_runtimes
from providers.faults import FaultProvider
from tests.runtime.commands.conftest import program_action, running
from tests.runtime.sessions import dumps, fast_manager, new_operation_id, start
from tests.runtime.support import strap

UNKNOWN = "deferred:sensorium.directive.invoke:AAAAAAAAAAAAAAAAAAAAAAAAAA"
TERMINAL = {"completed", "failed", "timed-out", "cancelled", "expired"}


async def _unknown_everywhere(runtime: OperationRuntime) -> None:
    assert await runtime.status(UNKNOWN) is None
    assert await runtime.wait(UNKNOWN, None, 0.0) is None
    assert await runtime.cancel(UNKNOWN) is None
    assert await runtime.observe(UNKNOWN) is None
    await runtime.stop(UNKNOWN, "deadline-exceeded")


async def _ended(runtime: OperationRuntime, op_id: str) -> str:
    with anyio.fail_after(5):
        while True:
            observed = await runtime.observe(op_id)
            assert observed is not None
            if observed.status in TERMINAL:
                return observed.status
            await anyio.sleep(0.02)


@pytest.mark.asyncio
async def test_each_kind_is_registered_under_its_own_name(tmp_path: Path) -> None:
    async with fast_manager() as manager, running(tmp_path) as (_, runner):
        runtimes = operation_runtimes(manager, runner)
        assert {kind: (runtime.kind, runtime.bindable) for kind, runtime in runtimes.items()} == {
            "discovery": ("discovery", True),
            "command": ("command", False),
        }
        for runtime in runtimes.values():
            await _unknown_everywhere(runtime)


@pytest.mark.asyncio
async def test_a_scan_observed_stopped_and_read_through_the_interface() -> None:
    async with fast_manager() as manager:
        runtime = DiscoveryRuntime(manager)
        handle = await start(manager, FaultProvider([(0, strap(1))]), window_ms=5_000)
        op_id = handle.operation_id
        observed = await runtime.observe(op_id)
        assert observed is not None and observed.document is None and observed.retry_hint is None
        assert observed.status in ("pending", "running")
        assert "strap-1" not in dumps(dict(observed.metadata))
        await runtime.stop(op_id, "deadline-exceeded")
        assert await _ended(runtime, op_id) == "failed"
        final = await runtime.wait(op_id, None, 0.0)
        assert final is not None and final["status"] == "failed"
        assert final == await runtime.status(op_id)
        cancelled = await runtime.cancel(op_id)  # terminal: the unchanged status
        assert cancelled is not None and cancelled["status"] == "failed"


@pytest.mark.asyncio
async def test_a_command_observed_and_stopped_through_the_interface(tmp_path: Path) -> None:
    action = program_action("sleep", str(tmp_path / "started"), "30")
    async with running(tmp_path) as (_, runner):
        runtime = CommandRuntime(runner)
        op_id = new_operation_id()
        await runner.submit(op_id, "alice", action, {}, "async", datetime.now(UTC))
        observed = await runtime.observe(op_id)
        assert observed is not None and observed.document is not None
        assert observed.status in ("pending", "running") and observed.retry_hint == 1
        assert "result" not in observed.metadata
        await runtime.stop(op_id, "deadline-exceeded")
        final = await runtime.wait(op_id, None, 0.0)
        assert final is not None and final["status"] == "cancelled"
        assert final == await runtime.status(op_id) == await runtime.cancel(op_id)
