"""The lifecycle table checked both ways: every legal move works, every other move raises."""

from __future__ import annotations

import itertools

import pytest

from connector.contract.semantic import STATUSES
from connector.contract.semantic import TERMINAL_STATUSES as WIRE_TERMINAL
from connector.core.lifecycle import (
    BUS_TERMINAL_STATES,
    HOST_ONLY_EVENTS,
    TERMINAL_STATUSES,
    TRANSITIONS,
    BusState,
    Event,
    IllegalTransition,
    Role,
    Status,
    bus_reason,
    bus_state,
    check_observed,
    check_transition,
    event_for,
    is_terminal,
    next_status,
    reachable,
)
from connector.errors import LifecycleError, SensoriumError

S, E = Status, Event

# Written from CONTRACT §5, independently of TRANSITIONS: (from, event) -> (to, host only?).
LEGAL: dict[tuple[Status, Event], tuple[Status, bool]] = {
    (S.PENDING, E.START): (S.RUNNING, False),
    (S.PENDING, E.CANCEL): (S.CANCELLED, False),
    (S.PENDING, E.EXPIRE): (S.EXPIRED, False),
    (S.PENDING, E.FAIL): (S.FAILED, False),
    (S.PENDING, E.LOSE): (S.UNKNOWN, True),
    (S.RUNNING, E.COMPLETE): (S.COMPLETED, False),
    (S.RUNNING, E.FAIL): (S.FAILED, False),
    (S.RUNNING, E.TIME_OUT): (S.TIMED_OUT, False),
    (S.RUNNING, E.CANCEL): (S.CANCELLED, False),
    (S.RUNNING, E.EXPIRE): (S.EXPIRED, False),
    (S.RUNNING, E.LOSE): (S.UNKNOWN, True),
}
ALL_PAIRS = list(itertools.product(Status, Event))
ALL_STATUS_PAIRS = list(itertools.product(Status, Status))


def test_wire_spellings() -> None:
    assert [s.value for s in Status] == [
        "pending",
        "running",
        "completed",
        "failed",
        "timed-out",
        "cancelled",
        "expired",
        "unknown",
    ]
    assert [b.value for b in BusState] == [
        "queued",
        "running",
        "done",
        "failed",
        "cancelled",
        "lost",
        "unknown",
    ]


def test_table_covers_every_status_and_matches_spec() -> None:
    assert set(TRANSITIONS) == set(Status)
    table = {(s, e): new for s, moves in TRANSITIONS.items() for e, new in moves.items()}
    assert table == {pair: new for pair, (new, _) in LEGAL.items()}
    assert {e for (_, e), (_, host) in LEGAL.items() if host} == HOST_ONLY_EVENTS


def test_terminal_statuses() -> None:
    expected = {S.COMPLETED, S.FAILED, S.TIMED_OUT, S.CANCELLED, S.EXPIRED, S.UNKNOWN}
    assert expected == TERMINAL_STATUSES
    assert all(is_terminal(s) == (s in expected) for s in Status)


def test_the_wire_states_the_same_statuses_and_terminal_set() -> None:
    # contract/ sits below core/, so its literals are the one other statement; they must agree.
    assert {s.value for s in Status} == STATUSES
    assert {s.value for s in TERMINAL_STATUSES} == WIRE_TERMINAL


def test_table_is_read_only() -> None:
    with pytest.raises(TypeError):
        TRANSITIONS[S.PENDING] = {}  # type: ignore[index]
    with pytest.raises(TypeError):
        TRANSITIONS[S.COMPLETED][E.START] = S.RUNNING  # type: ignore[index]


@pytest.mark.parametrize(("current", "event"), ALL_PAIRS)
def test_next_status_as_host(current: Status, event: Event) -> None:
    if (current, event) in LEGAL:
        assert next_status(current, event, role=Role.HOST) is LEGAL[current, event][0]
        return
    with pytest.raises(IllegalTransition) as info:
        next_status(current, event, role=Role.HOST)
    assert (info.value.current, info.value.new, info.value.event) == (current, None, event)


@pytest.mark.parametrize(("current", "event"), ALL_PAIRS)
def test_next_status_as_connector(current: Status, event: Event) -> None:
    legal = LEGAL.get((current, event))
    if legal is not None and not legal[1]:
        assert next_status(current, event) is legal[0]
        return
    with pytest.raises(IllegalTransition) as info:
        next_status(current, event, role=Role.CONNECTOR)
    assert info.value.current is current
    assert info.value.event is event


@pytest.mark.parametrize(("current", "new"), ALL_STATUS_PAIRS)
def test_check_transition_both_roles(current: Status, new: Status) -> None:
    moves = {(to, host) for (frm, _), (to, host) in LEGAL.items() if frm is current}
    for role in Role:
        allowed = any(to is new and (role is Role.HOST or not host) for to, host in moves)
        if allowed:
            check_transition(current, new, role=role)
            assert next_status(current, event_for(current, new, role=role), role=role) is new
            continue
        with pytest.raises(IllegalTransition) as info:
            check_transition(current, new, role=role)
        assert (info.value.current, info.value.new) == (current, new)


@pytest.mark.parametrize("terminal", sorted(TERMINAL_STATUSES))
def test_nothing_leaves_a_terminal_status(terminal: Status) -> None:
    for new, role in itertools.product(Status, Role):
        with pytest.raises(IllegalTransition):
            check_transition(terminal, new, role=role)
    assert reachable(terminal, role=Role.HOST) == frozenset()


def test_staying_put_is_not_a_move() -> None:
    for status in Status:
        with pytest.raises(IllegalTransition):
            check_transition(status, status, role=Role.HOST)


def test_illegal_transition_is_typed() -> None:
    with pytest.raises(IllegalTransition) as info:
        check_transition(S.COMPLETED, S.RUNNING)
    error = info.value
    assert isinstance(error, LifecycleError)
    assert isinstance(error, SensoriumError)
    assert error.code == "illegal-transition"
    assert error.http_status == 500
    assert error.to_document() == {
        "schema": "sensorium-error.v1",
        "code": "illegal-transition",
        "message": "illegal lifecycle transition completed -> running",
    }


def test_reachable() -> None:
    after_pending = {S.RUNNING, S.COMPLETED, S.FAILED, S.TIMED_OUT, S.CANCELLED, S.EXPIRED}
    assert reachable(S.PENDING) == after_pending
    assert reachable(S.PENDING, role=Role.HOST) == after_pending | {S.UNKNOWN}
    assert reachable(S.RUNNING) == after_pending - {S.RUNNING}


OBSERVED_OK = [
    (S.PENDING, S.PENDING),
    (S.PENDING, S.RUNNING),
    (S.PENDING, S.COMPLETED),
    (S.PENDING, S.TIMED_OUT),
    (S.RUNNING, S.RUNNING),
    (S.RUNNING, S.UNKNOWN),
    (S.COMPLETED, S.COMPLETED),
    (S.UNKNOWN, S.UNKNOWN),
]
OBSERVED_BAD = [
    (S.RUNNING, S.PENDING),
    (S.COMPLETED, S.FAILED),
    (S.FAILED, S.RUNNING),
    (S.CANCELLED, S.COMPLETED),
    (S.UNKNOWN, S.RUNNING),
    (S.EXPIRED, S.UNKNOWN),
]


@pytest.mark.parametrize(("previous", "observed"), OBSERVED_OK)
def test_check_observed_accepts_skips_and_repeats(previous: Status, observed: Status) -> None:
    check_observed(previous, observed)


@pytest.mark.parametrize(("previous", "observed"), OBSERVED_BAD)
def test_check_observed_refuses_going_back(previous: Status, observed: Status) -> None:
    with pytest.raises(IllegalTransition):
        check_observed(previous, observed)


def test_check_observed_as_connector_cannot_lose() -> None:
    with pytest.raises(IllegalTransition):
        check_observed(S.RUNNING, S.UNKNOWN, role=Role.CONNECTOR)


BUS = {
    S.PENDING: BusState.QUEUED,
    S.RUNNING: BusState.RUNNING,
    S.COMPLETED: BusState.DONE,
    S.FAILED: BusState.FAILED,
    S.TIMED_OUT: BusState.FAILED,
    S.EXPIRED: BusState.FAILED,
    S.CANCELLED: BusState.CANCELLED,
    S.UNKNOWN: BusState.UNKNOWN,
}


@pytest.mark.parametrize("status", list(Status))
def test_bus_state(status: Status) -> None:
    assert bus_state(status) is BUS[status]


@pytest.mark.parametrize("status", [S.PENDING, S.RUNNING, S.FAILED])
def test_bus_state_interrupted_is_lost(status: Status) -> None:
    assert bus_state(status, interrupted=True) is BusState.LOST


@pytest.mark.parametrize("status", [S.COMPLETED, S.TIMED_OUT, S.CANCELLED, S.EXPIRED, S.UNKNOWN])
def test_bus_state_interrupted_refused_for_other_ends(status: Status) -> None:
    with pytest.raises(LifecycleError):
        bus_state(status, interrupted=True)


def test_bus_unknown_is_not_terminal() -> None:
    assert BusState.UNKNOWN not in BUS_TERMINAL_STATES
    assert {BusState.DONE, BusState.FAILED, BusState.CANCELLED, BusState.LOST} == BUS_TERMINAL_STATES
    # A terminal v1 status maps to a terminal Bus state, except `unknown`, which a caller may retry.
    for status in TERMINAL_STATUSES - {S.UNKNOWN}:
        assert bus_state(status) in BUS_TERMINAL_STATES


@pytest.mark.parametrize(
    ("status", "error_code", "reason"),
    [
        (S.FAILED, "provider-failure", "provider-failure"),
        (S.FAILED, "response-too-large", "response-too-large"),
        (S.FAILED, "interrupted-by-restart", "interrupted-by-restart"),
        (S.FAILED, None, "failed"),
        (S.TIMED_OUT, None, "timed-out"),
        (S.TIMED_OUT, "deadline-exceeded", "timed-out"),
        (S.EXPIRED, None, "expired"),
        (S.COMPLETED, None, None),
        (S.CANCELLED, None, None),
        (S.PENDING, None, None),
        (S.RUNNING, None, None),
        (S.UNKNOWN, None, None),
    ],
)
def test_bus_reason(status: Status, error_code: str | None, reason: str | None) -> None:
    assert bus_reason(status, error_code) == reason


def test_plain_strings_work_like_statuses() -> None:
    # Stored rows hold plain strings; the table must accept them as the StrEnum they spell.
    assert next_status("pending", "start") is S.RUNNING  # type: ignore[arg-type]
    check_transition("running", "timed-out")  # type: ignore[arg-type]
    check_observed("pending", "completed")  # type: ignore[arg-type]
    with pytest.raises(IllegalTransition):
        check_transition("completed", "running")  # type: ignore[arg-type]
    assert bus_state("timed-out") is BusState.FAILED  # type: ignore[arg-type]
    assert bus_reason("failed", "provider-failure") == "provider-failure"  # type: ignore[arg-type]
    assert bus_reason("expired") == "expired"  # type: ignore[arg-type]
