"""The operation lifecycle (CONTRACT §5) as one transition table, shared by connector and host.

Rules of this file:
- `TRANSITIONS` is the only place a move is defined: state -> event -> new state. Everything else here
  (`next_status`, `check_transition`, `check_observed`, the diagram) is derived from it.
- A terminal status has no outgoing moves; any attempt raises `IllegalTransition`.
- `lose` (-> `unknown`) is the host's move alone: the connector answered 404 `unknown-operation`.
- The Bus collapses statuses into its own states (CONTRACT §10); that mapping lives here too, so it can only
  follow the table.
- Pure: no I/O, no clock, no logging.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

from connector.errors import Code, LifecycleError


class Status(StrEnum):
    """The status of a deferred operation, spelled as on the wire."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed-out"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    UNKNOWN = "unknown"


class Event(StrEnum):
    """What moves an operation from one status to the next."""

    START = "start"
    COMPLETE = "complete"
    FAIL = "fail"
    TIME_OUT = "time_out"
    CANCEL = "cancel"
    EXPIRE = "expire"
    LOSE = "lose"


class Role(StrEnum):
    """Who applies a move: the connector that does the work or the host that polls it."""

    CONNECTOR = "connector"
    HOST = "host"


class BusState(StrEnum):
    """Operation state as the Bus reports it (CONTRACT §10)."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"
    UNKNOWN = "unknown"


INITIAL_STATUS = Status.PENDING

TRANSITIONS: Mapping[Status, Mapping[Event, Status]] = MappingProxyType(
    {
        Status.PENDING: MappingProxyType(
            {
                Event.START: Status.RUNNING,
                Event.FAIL: Status.FAILED,
                Event.CANCEL: Status.CANCELLED,
                Event.EXPIRE: Status.EXPIRED,
                Event.LOSE: Status.UNKNOWN,
            }
        ),
        Status.RUNNING: MappingProxyType(
            {
                Event.COMPLETE: Status.COMPLETED,
                Event.FAIL: Status.FAILED,
                Event.TIME_OUT: Status.TIMED_OUT,
                Event.CANCEL: Status.CANCELLED,
                Event.EXPIRE: Status.EXPIRED,
                Event.LOSE: Status.UNKNOWN,
            }
        ),
        Status.COMPLETED: MappingProxyType({}),
        Status.FAILED: MappingProxyType({}),
        Status.TIMED_OUT: MappingProxyType({}),
        Status.CANCELLED: MappingProxyType({}),
        Status.EXPIRED: MappingProxyType({}),
        Status.UNKNOWN: MappingProxyType({}),
    }
)

HOST_ONLY_EVENTS: frozenset[Event] = frozenset({Event.LOSE})

TERMINAL_STATUSES: frozenset[Status] = frozenset(s for s, moves in TRANSITIONS.items() if not moves)

BUS_TERMINAL_STATES: frozenset[BusState] = frozenset(
    {BusState.DONE, BusState.FAILED, BusState.CANCELLED, BusState.LOST}
)

INTERRUPTED_BY_RESTART = Code.INTERRUPTED_BY_RESTART


class IllegalTransition(LifecycleError):
    """A move the lifecycle table does not allow; carries both statuses (and the event, if any)."""

    default_code = Code.ILLEGAL_TRANSITION

    def __init__(self, current: Status, new: Status | None = None, *, event: Event | None = None) -> None:
        target = str(new) if new is not None else f"<{event}>"
        super().__init__(f"illegal lifecycle transition {current} -> {target}")
        self.current = Status(current)
        self.new = None if new is None else Status(new)
        self.event = event


def is_terminal(status: Status) -> bool:
    """True when the status never changes again."""
    return status in TERMINAL_STATUSES


def _allowed(event: Event, role: Role) -> bool:
    return role == Role.HOST or event not in HOST_ONLY_EVENTS


def next_status(current: Status, event: Event, *, role: Role = Role.CONNECTOR) -> Status:
    """The status `event` leads to from `current`; raises `IllegalTransition` when the table has no move."""
    new = TRANSITIONS[current].get(event)
    if new is None or not _allowed(event, role):
        raise IllegalTransition(current, new, event=event)
    return new


def event_for(current: Status, new: Status, *, role: Role = Role.CONNECTOR) -> Event:
    """The one event that moves `current` to `new`; raises `IllegalTransition` when there is none."""
    for event, target in TRANSITIONS[current].items():
        if target == new and _allowed(event, role):
            return event
    raise IllegalTransition(current, new)


def check_transition(current: Status, new: Status, *, role: Role = Role.CONNECTOR) -> None:
    """Refuse a single move that is not an edge of the table (staying put is not a move)."""
    event_for(current, new, role=role)


def reachable(current: Status, *, role: Role = Role.CONNECTOR) -> frozenset[Status]:
    """Every status reachable from `current` in one or more moves."""
    seen: set[Status] = set()
    frontier = [current]
    while frontier:
        for event, target in TRANSITIONS[frontier.pop()].items():
            if target not in seen and _allowed(event, role):
                seen.add(target)
                frontier.append(target)
    return frozenset(seen)


def check_observed(previous: Status, observed: Status, *, role: Role = Role.HOST) -> None:
    """Refuse a polled status that cannot follow the last one seen (polls may skip states or repeat)."""
    # A poller sees snapshots, not moves: pending may be followed by completed with running unseen.
    if observed == previous or observed in reachable(previous, role=role):
        return
    raise IllegalTransition(previous, observed)


_BUS_STATE: Mapping[Status, BusState] = MappingProxyType(
    {
        Status.PENDING: BusState.QUEUED,
        Status.RUNNING: BusState.RUNNING,
        Status.COMPLETED: BusState.DONE,
        Status.FAILED: BusState.FAILED,
        Status.TIMED_OUT: BusState.FAILED,
        Status.EXPIRED: BusState.FAILED,
        Status.CANCELLED: BusState.CANCELLED,
        Status.UNKNOWN: BusState.UNKNOWN,
    }
)


def bus_state(status: Status, *, interrupted: bool = False) -> BusState:
    """The Bus state of an operation; `interrupted` marks one cut by a connector restart."""
    if interrupted:
        if status in (Status.PENDING, Status.RUNNING, Status.FAILED):
            return BusState.LOST
        raise LifecycleError(f"a {status} operation cannot have been interrupted by a restart")
    return _BUS_STATE[status]


def bus_reason(status: Status, error_code: str | None = None) -> str | None:
    """The Bus `reason`: what the collapse into `failed`/`lost` hides, else None."""
    # timed-out and expired both become Bus `failed`; their own status is what a caller cannot recover.
    if status in (Status.TIMED_OUT, Status.EXPIRED):
        return str(status)
    if status == Status.FAILED:
        return error_code or str(status)
    return None


def _node(status: Status) -> str:
    return status.value.replace("-", "_")


def _edge_label(event: Event) -> str:
    return f"{event.value} (host only)" if event in HOST_ONLY_EVENTS else event.value


def mermaid() -> str:
    """A `stateDiagram-v2` drawn from `TRANSITIONS`."""
    lines = ["stateDiagram-v2"]
    lines += [f'    state "{s.value}" as {_node(s)}' for s in TRANSITIONS if _node(s) != s.value]
    lines.append(f"    [*] --> {_node(INITIAL_STATUS)}")
    for current, moves in TRANSITIONS.items():
        lines += [f"    {_node(current)} --> {_node(new)}: {_edge_label(e)}" for e, new in moves.items()]
    lines += [f"    {_node(s)} --> [*]" for s in TRANSITIONS if s in TERMINAL_STATUSES]
    return "\n".join(lines) + "\n"
