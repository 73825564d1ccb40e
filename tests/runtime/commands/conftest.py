"""Helpers for the command runner tests: a runner over a fresh state file, actions, status checks."""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio

from connector.core.clock import from_ms
from connector.core.commands import CommandAction
from connector.runtime.commands import CommandRunner
from connector.storage.state import ConnectorState
from connector.timer import VirtualTimer

PROGRAMS = Path(__file__).with_name("programs.py")
TERMINAL = {"completed", "failed", "timed-out", "cancelled", "expired", "unknown"}


def program_action(*args: str, action_id: str = "test.program", **kw: Any) -> CommandAction:
    """A command action running `programs.py` with the `python3` alias."""
    fields: dict[str, Any] = {
        "action_id": action_id,
        "argv": ("python3", str(PROGRAMS), *args),
        "timeout_ms": 20000,
        "cancel": "terminate",
        "input": "none",
        "execution_mode_support": "either",
    }
    fields.update(kw)
    return CommandAction(**fields)


@asynccontextmanager
async def running(data_dir: Path, **kw: Any) -> AsyncIterator[tuple[ConnectorState, CommandRunner]]:
    """A state store and a started runner over `data_dir` (runner closed before the store)."""
    kw.setdefault("kill_after_seconds", 0.3)
    async with await ConnectorState.open(data_dir) as state, CommandRunner(state, **kw) as runner:
        yield state, runner


async def wait_for_file(path: Path, timeout: float = 15.0) -> str:
    """The content of a marker file once a program wrote it."""
    with anyio.fail_after(timeout):
        while not path.exists():
            await anyio.sleep(0.02)  # real peer: the command subprocess writes it
    return path.read_text()


async def wait_terminal(runner: CommandRunner, op_id: str, timeout: float = 20.0) -> dict[str, Any]:
    """Poll until the status is terminal; every poll is shape-checked."""
    with anyio.fail_after(timeout):
        while True:
            doc = await runner.status(op_id)
            assert doc is not None, "the runner does not know the operation"
            check_status_shape(doc)
            if doc["status"] in TERMINAL:
                return doc
            await anyio.sleep(0.02)  # real peer: the command subprocess ends it


def check_status_shape(doc: dict[str, Any]) -> None:
    """CONTRACT §1 rules for a v1 status, plus the contract validator when it exists."""
    assert doc["schema"] == "deferred-operation-status.v1" and doc["schema/v"] == 1
    assert doc["operation/kind"] == "sensorium.directive.invoke"
    assert doc["diagnostics"] == []
    terminal = doc["status"] in TERMINAL
    assert ("retry_after_seconds" in doc) == (not terminal)
    assert ("result" in doc) == (doc["status"] == "completed")
    if terminal and doc["status"] not in ("completed", "cancelled"):
        assert set(doc["error"]) == {"code", "message"}
    contract_violations("deferred-operation-status.v1", doc)


def contract_violations(schema: str, doc: Any) -> None:
    """Validate with the contract engineer's validator when present (it is written in parallel)."""
    try:
        validate = importlib.import_module("connector.contract.validate").validate
    except ModuleNotFoundError:
        return
    violations = validate(schema, doc, via="schema")
    assert not violations, [str(v) for v in violations]


def pid_alive(pid: int) -> bool:
    """True when a process with this pid still exists (and is not a zombie of ours)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


async def status_of(runner: CommandRunner, op_id: str, wait_s: float = 0.0) -> dict[str, Any]:
    """The status of an operation the runner stored (with `wait_s`, once terminal or then)."""
    doc = await runner.status(op_id, wait_s=wait_s)
    assert doc is not None, "the runner does not know the operation"
    return doc


async def cancel_status(runner: CommandRunner, op_id: str) -> dict[str, Any]:
    """The status after a cancel of an operation the runner stored."""
    answer = await runner.cancel(op_id)
    assert answer is not None, "the runner does not know the operation"
    return answer[1]


async def sync_call(
    runner: CommandRunner,
    answers: list[dict[str, Any]],
    op_id: str,
    action: CommandAction,
    now: datetime,
    **kw: Any,
) -> None:
    """One sync submission, run as a task while the test moves the timer; its answer lands in `answers`."""
    answers.append(await runner.submit(op_id, "victim", action, {}, "sync", now, **kw))


async def answered(answers: list[dict[str, Any]], timeout: float = 15.0) -> dict[str, Any]:
    """The sync answer, once the runner has reaped the real process behind it."""
    with anyio.fail_after(timeout):
        while not answers:
            await anyio.sleep(0.01)  # real peer: the runner reaps the real process
    return answers[0]


def virtual_now(timer: VirtualTimer) -> datetime:
    """The virtual now as the runner stores it."""
    return from_ms(timer.now_ms())
