"""Lifecycle events from the runtime's own objects: discovery sessions and command operations."""

from __future__ import annotations

from connector.runtime.session import DiscoverySession
from connector.storage.state import CommandOperation
from connector.telemetry.events import LifecycleEvent


def session_event(event: str, session: DiscoverySession) -> LifecycleEvent:
    """The durable facts of a discovery session at one lifecycle event (never its candidates)."""
    spec = session.spec
    ended = session.terminal_at_ms if event == "ended" else None
    state = session.state
    requested, confirmed = state.cancellation_requested_at_ms, state.cancellation_confirmed_at_ms
    stopped = event in ("ended", "cleanup-confirmed")
    return LifecycleEvent(
        event=event,
        operation_id=spec.operation_id,
        action_id=spec.action_id,
        kind="discovery",
        status=session.status.value,
        transport=spec.scope.transport,
        adapter=session.claim.key.adapter,
        code=state.reason or state.error_code,
        cleanup=session.cleanup_state if stopped else None,
        claim=session.claim_state if stopped else None,
        duration_ms=None if ended is None else ended - spec.created_at_ms,
        cancel_latency_ms=(
            confirmed - requested
            if event == "ended" and confirmed is not None and requested is not None
            else None
        ),
        cleanup_ms=session.last_stop_ms if stopped else None,
    )


def command_event(event: str, operation: CommandOperation) -> LifecycleEvent:
    """The durable facts of a command operation at one lifecycle event (never its input or output)."""
    duration = operation.updated_at - operation.created_at if event == "ended" else None
    return LifecycleEvent(
        event=event,
        operation_id=operation.operation_id,
        action_id=operation.action_id,
        kind="command",
        status=operation.status,
        code=operation.error_code,
        duration_ms=None if duration is None else int(duration.total_seconds() * 1000),
    )
