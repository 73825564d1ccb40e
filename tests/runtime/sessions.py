"""Driving sessions in tests: start one on a manager, poll it to the end, check the whole poll sequence.

With a `VirtualTimer` the session, its provider and the polls run on virtual time: a poll "every 20 ms" is
a 20 ms advance of the timer, and nothing waits on the wall clock.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import anyio

from connector.core.admission import SessionSpec
from connector.core.clock import wall_clock_ms
from connector.core.endings import CleanupState
from connector.core.ids import OPERATION_KIND, random_operation_id
from connector.core.projections import caller_status_v2, disclosed_refs, durable_metadata
from connector.core.scope import DiscoveryProfile, DiscoveryScope
from connector.runtime.manager import DiscoveryManager, ScanAdmission
from connector.runtime.session import DiscoverySession
from connector.timer import VirtualTimer
from providers.base import Provider
from tests.runtime.support import PROFILE, ble_scope

STATUS_V2 = "deferred-operation-status.v2"
CAUSAL = {"operation/id": "deferred:sensorium.directive.invoke:AAAAAAAAAAAAAAAAAAAAAAAAAA", "trace/id": "t-1"}


def new_operation_id() -> str:
    return random_operation_id(OPERATION_KIND, secrets.token_bytes(16))


@dataclass(frozen=True, slots=True)
class Started:
    """A scan a test started: its id and its session."""

    operation_id: str
    session: DiscoverySession

    @property
    def termination_confirmed(self) -> bool:
        """Terminal, and its provider stop was acknowledged."""
        return self.session.is_terminal and self.session.cleanup_state is CleanupState.CONFIRMED


def fast_manager(timer: VirtualTimer | None = None, **options: Any) -> DiscoveryManager:
    """A manager whose background cleanup retries are quick enough for tests; on `timer` when given."""
    options.setdefault("cleanup_retry_initial_s", 0.05)
    options.setdefault("cleanup_retry_max_s", 0.2)
    if timer is not None:
        options["timer"] = timer
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
) -> Started:
    """Admit a scan on `manager`, its moments on `timer` (the manager's own) when given."""
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
    session = await manager.admit(ScanAdmission(spec, provider))
    return Started(spec.operation_id, session)


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
            polls.append(await delivered_status(manager, operation_id))
            if polls[-1]["status"] not in ("pending", "running"):
                break
            await anyio.sleep(every_s)  # real peer: a caller's poll interval on a real-time session
    polls.append(await delivered_status(manager, operation_id))
    return polls


async def _poll_on(
    timer: VirtualTimer, manager: DiscoveryManager, operation_id: str, *, every_ms: int
) -> list[dict[str, Any]]:
    """`poll_to_end` on virtual time: a poll, then `every_ms` of the timer, until terminal."""
    polls = [delivered_now(manager, operation_id)]
    await drive_until(
        timer,
        lambda: polls[-1]["status"] not in ("pending", "running"),
        every_ms=every_ms,
        between=lambda: polls.append(delivered_now(manager, operation_id)),
    )
    polls.append(delivered_now(manager, operation_id))
    return polls


async def drive_until(
    timer: VirtualTimer,
    done: Callable[[], bool],
    *,
    every_ms: int = 20,
    limit_ms: int = 120_000,
    between: Callable[[], object] = lambda: None,
) -> None:
    """Advance `timer` `every_ms` at a time until `done()`; `between` runs after each step."""
    deadline_ms = timer.now_ms() + limit_ms
    while not done():
        if timer.now_ms() >= deadline_ms:
            raise AssertionError(f"not done within {limit_ms} ms of virtual time")
        await timer.advance(every_ms)
        between()


async def until_terminal(
    manager: DiscoveryManager, operation_id: str, limit_s: float = 10.0
) -> dict[str, Any]:
    """Long-poll until the operation is terminal (its stop settled) and return that status."""
    with anyio.fail_after(limit_s):
        status = await waited(manager, operation_id, None, limit_s)
        while status["status"] in ("pending", "running"):
            status = await waited(manager, operation_id, None, limit_s)
    return status


async def waited(
    manager: DiscoveryManager, operation_id: str, after: int | None, wait_s: float
) -> dict[str, Any]:
    """The long-polled status of a scan the manager holds."""
    status = await manager.status(operation_id, after=after, wait_s=wait_s)
    assert status is not None, "the manager no longer holds the scan"
    return status


async def status_of(manager: DiscoveryManager, operation_id: str) -> dict[str, Any]:
    """The current status of a scan the manager holds (a read: nothing counts as disclosed)."""
    return await waited(manager, operation_id, None, 0.0)


async def cancelled(manager: DiscoveryManager, operation_id: str) -> dict[str, Any]:
    """The status after a cancel request on a scan the manager holds."""
    answer = await manager.cancel(operation_id)
    assert answer is not None, "the manager no longer holds the scan"
    return answer[1]


def _held(manager: DiscoveryManager, operation_id: str) -> DiscoverySession:
    session = manager.session(operation_id)
    assert session is not None, "the manager no longer holds the scan"
    return session


def metadata_of(manager: DiscoveryManager, operation_id: str) -> dict[str, Any]:
    """The durable metadata of a scan the manager holds."""
    return durable_metadata(_held(manager, operation_id).view())


async def delivered_status(manager: DiscoveryManager, operation_id: str) -> dict[str, Any]:
    """The status as the service hands it to a caller: read, then its candidates counted as disclosed."""
    document = await status_of(manager, operation_id)
    manager.mark_disclosed(operation_id)
    return document


def status_now(manager: DiscoveryManager, operation_id: str) -> dict[str, Any]:
    """The current status without a checkpoint (a read: nothing counts as disclosed)."""
    return caller_status_v2(_held(manager, operation_id).view())


def delivered_now(manager: DiscoveryManager, operation_id: str) -> dict[str, Any]:
    """`delivered_status` without a checkpoint (between two steps of a virtual timer)."""
    session = _held(manager, operation_id)
    view = session.view()
    session.disclosed.update(disclosed_refs(view))
    return caller_status_v2(view)


def assert_valid_polls(polls: Sequence[Mapping[str, Any]]) -> None:
    """The whole poll sequence passes the contract (schema + semantic, cross-poll rules included)."""
    from connector.contract.validate import validate

    violations = validate(STATUS_V2, [dict(p) for p in polls], via="schema")
    assert violations == [], [str(v) for v in violations]


def with_profile(**changes: Any) -> DiscoveryProfile:
    return replace(PROFILE, **changes)


def dumps(document: Any) -> str:
    return json.dumps(document, sort_keys=True)
