"""Driving sessions in tests: start one on a manager, poll it to the end, check the whole poll sequence.

With a `VirtualTimer` the session, its provider and the polls run on virtual time: a poll "every 20 ms" is
a 20 ms advance of the timer, and nothing waits on the wall clock.
"""

from __future__ import annotations

import inspect
import json
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import anyio

from connector.core.admission import SessionSpec
from connector.core.clock import wall_clock_ms
from connector.core.ids import OPERATION_KIND, random_operation_id
from connector.core.scope import DiscoveryProfile, DiscoveryScope
from connector.runtime.manager import DiscoveryManager
from connector.runtime.session import SessionHandle
from connector.timer import VirtualTimer
from providers.base import Provider
from tests.runtime.support import PROFILE, ble_scope

STATUS_V2 = "deferred-operation-status.v2"
CAUSAL = {"operation/id": "deferred:sensorium.directive.invoke:AAAAAAAAAAAAAAAAAAAAAAAAAA", "trace/id": "t-1"}


def new_operation_id() -> str:
    return random_operation_id(OPERATION_KIND, secrets.token_bytes(16))


# The manager takes its timer as `clock=` until it takes a `timer=` (issue 15's manager rewrite).
_MANAGER_TIMER = "timer" if "timer" in inspect.signature(DiscoveryManager).parameters else "clock"


def fast_manager(timer: VirtualTimer | None = None, **options: Any) -> DiscoveryManager:
    """A manager whose background cleanup retries are quick enough for tests; on `timer` when given."""
    options.setdefault("cleanup_retry_initial_s", 0.05 if timer is None else 0.001)
    options.setdefault("cleanup_retry_max_s", 0.2 if timer is None else 0.004)
    if timer is not None:
        options[_MANAGER_TIMER] = timer
    return DiscoveryManager(**options)


async def start(
    manager: DiscoveryManager,
    provider: Provider,
    *,
    scope: DiscoveryScope | None = None,
    profile: DiscoveryProfile = PROFILE,
    window_ms: int = 300,
    timeout_ms: int | None = None,
    expires_in_ms: int | None = 10_000,
    cut_by_deadline: bool = False,
    owner: str = "alice",
    operation_id: str | None = None,
    timer: VirtualTimer | None = None,
) -> SessionHandle:
    now = wall_clock_ms() if timer is None else timer.now_ms()
    spec = SessionSpec(
        operation_id=operation_id or new_operation_id(),
        owner=owner,
        action_id="device.discovery.scan",
        scope=scope or ble_scope(),
        profile=profile,
        created_at_ms=now,
        window_end_ms=now + window_ms,
        cut_by_deadline=cut_by_deadline,
        timeout_at_ms=None if timeout_ms is None else now + timeout_ms,
        expires_at_ms=None if expires_in_ms is None else now + expires_in_ms,
        causal_context=CAUSAL,
        retry_after_seconds=1,
    )
    return await manager.start_scan(spec, provider)


async def poll_to_end(
    manager: DiscoveryManager,
    operation_id: str,
    *,
    every_s: float = 0.02,
    limit_s: float = 5.0,
    timer: VirtualTimer | None = None,
) -> list[dict[str, Any]]:
    """Poll until terminal (and once more after) as a caller would, returning every status delivered."""
    if timer is not None:
        return await _poll_on(timer, manager, operation_id, every_ms=int(every_s * 1000))
    polls: list[dict[str, Any]] = []
    with anyio.fail_after(limit_s):
        while True:
            polls.append(delivered_status(manager, operation_id))
            if polls[-1]["status"] not in ("pending", "running"):
                break
            await anyio.sleep(every_s)
    polls.append(delivered_status(manager, operation_id))
    return polls


async def _poll_on(
    timer: VirtualTimer, manager: DiscoveryManager, operation_id: str, *, every_ms: int
) -> list[dict[str, Any]]:
    """`poll_to_end` on virtual time: a poll, then `every_ms` of the timer, until terminal."""
    polls = [delivered_status(manager, operation_id)]
    await drive_until(
        timer,
        lambda: polls[-1]["status"] not in ("pending", "running"),
        every_ms=every_ms,
        between=lambda: polls.append(delivered_status(manager, operation_id)),
    )
    polls.append(delivered_status(manager, operation_id))
    return polls


async def drive_until(
    timer: VirtualTimer,
    done: Callable[[], bool],
    *,
    every_ms: int = 20,
    limit_ms: int = 120_000,
    between: Callable[[], object] = lambda: None,
) -> None:
    """Advance `timer` `every_ms` at a time until `done()`; `between` runs after each step.

    A checkpoint follows each step: the manager's background retries still sleep on the loop until the
    manager takes the timer, and they must get their turn.
    """
    deadline_ms = timer.now_ms() + limit_ms
    while not done():
        if timer.now_ms() >= deadline_ms:
            raise AssertionError(f"not done within {limit_ms} ms of virtual time")
        await timer.advance(every_ms)
        await anyio.sleep(0)
        between()


async def until_terminal(
    manager: DiscoveryManager, operation_id: str, limit_s: float = 10.0
) -> dict[str, Any]:
    """Long-poll until the operation is terminal (its stop settled) and return that status."""
    with anyio.fail_after(limit_s):
        status = await manager.wait_for_change(operation_id, None, limit_s)
        while status["status"] in ("pending", "running"):
            status = await manager.wait_for_change(operation_id, None, limit_s)
    return status


def delivered_status(manager: DiscoveryManager, operation_id: str) -> dict[str, Any]:
    """The status as the service hands it to a caller: read, then its candidates counted as disclosed."""
    document = manager.status(operation_id)
    manager.mark_disclosed(operation_id, document)
    return document


def assert_valid_polls(polls: Sequence[Mapping[str, Any]]) -> None:
    """The whole poll sequence passes the contract (schema + semantic, cross-poll rules included)."""
    from connector.contract.validate import validate

    violations = validate(STATUS_V2, [dict(p) for p in polls], via="schema")
    assert violations == [], [str(v) for v in violations]


def with_profile(**changes: Any) -> DiscoveryProfile:
    return replace(PROFILE, **changes)


def dumps(document: Any) -> str:
    return json.dumps(document, sort_keys=True)
