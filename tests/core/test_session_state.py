"""The session as a frozen state and a pure step: each event's new state and effects, at a given now."""

from __future__ import annotations

from dataclasses import replace

import pytest

from connector.core.admission import SessionSpec
from connector.core.endings import (
    CANCELLATION_UNCONFIRMED,
    DEADLINE_EXCEEDED,
    PROVIDER_RESTARTED,
    CancellationState,
    CleanupState,
    EndCause,
    StopResult,
)
from connector.core.lifecycle import IllegalTransition, Status
from connector.core.scope import DiscoveryScope, ScopeFilter
from connector.core.session_state import (
    INERT_OUTCOMES,
    MIN_WAKE_MS,
    CancelRequested,
    CutMade,
    Effect,
    Emit,
    EndRequested,
    EraseResult,
    Finishing,
    InternalFailure,
    ProviderFailed,
    SessionState,
    Started,
    StartFailed,
    Stopped,
    StoppedLate,
    Terminate,
    TimerDue,
    initial_state,
    next_wake_ms,
    observed,
    start_deadline_ms,
    step,
)
from connector.core.snapshot import IngestOutcome
from tests.core.builders import profile

T0 = 1_800_000_000_000


def spec(**changes: object) -> SessionSpec:
    base = SessionSpec(
        operation_id="op-1",
        owner="alice",
        action_id="device.discovery.scan",
        scope=DiscoveryScope(
            transport="ble",
            window_seconds=1,
            max_candidates=8,
            max_snapshot_bytes=65536,
            filters=ScopeFilter(),
            cleanup_timeout_ms=200,
        ),
        profile=profile(),
        created_at_ms=T0,
        window_end_ms=T0 + 1_000,
        cut_by_deadline=False,
        timeout_at_ms=T0 + 5_000,
        expires_at_ms=T0 + 9_000,
        causal_context=None,
        retry_after_seconds=1,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def running(**changes: object) -> SessionState:
    state, _ = step(initial_state(spec(**changes)), Started(), T0 + 10)
    return state


def test_a_session_starts_pending_and_moves_to_running_through_the_lifecycle_table() -> None:
    pending = initial_state(spec())
    assert pending.status is Status.PENDING and pending.accepting and pending.cleanup is CleanupState.PENDING
    state, effects = step(pending, Started(), T0 + 10)
    assert state.status is Status.RUNNING
    assert (state.updated_at_ms, state.state_changed_at_ms) == (T0 + 10, T0 + 10)
    assert effects == (Effect.NOTIFY, Emit("running"))
    assert pending.status is Status.PENDING, "the old state is a value: it never changes"


def test_an_observation_changes_nothing_and_allocates_no_event() -> None:
    state = running()
    assert observed(IngestOutcome.ACCEPTED) is observed(IngestOutcome.ACCEPTED)
    after, effects = step(state, observed(IngestOutcome.ACCEPTED), T0 + 20)
    assert after is state and effects == (Effect.WAKE_IF_SOONER,)
    limited, effects = step(state, observed(IngestOutcome.LIMIT_REACHED), T0 + 20)
    assert limited.end_cause is EndCause.LIMIT and not limited.accepting and effects == (Effect.WAKE,)
    # The runner skips feeding these: the step would leave everything as it is.
    for outcome in INERT_OUTCOMES:
        assert step(state, observed(outcome), T0 + 20) == (state, ())


def test_the_timer_asks_for_a_cut_until_the_window_ends_then_sets_the_cause() -> None:
    state = running()
    during, effects = step(state, TimerDue(), T0 + 500)
    assert during is state and effects == (Effect.CUT,)
    revised, effects = step(state, CutMade(revised=True, limit_reached=False), T0 + 500)
    assert revised.updated_at_ms == T0 + 500 and revised.state_changed_at_ms == T0 + 10
    assert effects == (Effect.NOTIFY,)
    ended, effects = step(state, TimerDue(), T0 + 1_000)
    assert ended.end_cause is EndCause.WINDOW and effects == (Effect.WAKE,)
    cut_short, _ = step(running(cut_by_deadline=True), TimerDue(), T0 + 1_000)
    assert cut_short.end_cause is EndCause.DEADLINE


def test_the_earliest_passed_deadline_is_the_cause() -> None:
    assert step(running(), TimerDue(), T0 + 999)[0].end_cause is None
    late_window = running(window_end_ms=T0 + 9_500)
    assert step(late_window, TimerDue(), T0 + 5_000)[0].end_cause is EndCause.TIMEOUT
    no_timeout = running(window_end_ms=T0 + 9_500, timeout_at_ms=None)
    assert step(no_timeout, TimerDue(), T0 + 9_000)[0].end_cause is EndCause.EXPIRY


def test_a_cut_that_hit_a_bound_ends_the_session_limit_reached() -> None:
    state, effects = step(running(), CutMade(revised=True, limit_reached=True), T0 + 300)
    assert state.end_cause is EndCause.LIMIT and effects == (Effect.NOTIFY, Effect.WAKE)


def test_a_cancel_is_recorded_once_and_says_whether_it_changed_anything() -> None:
    state, effects = step(running(), CancelRequested(), T0 + 400)
    assert state.end_cause is EndCause.CANCEL and state.status is Status.RUNNING
    assert (
        state.cancellation is CancellationState.REQUESTED and state.cancellation_requested_at_ms == T0 + 400
    )
    assert effects == (Effect.WAKE, Effect.NOTIFY, Emit("cancel-requested"))
    again, effects = step(state, CancelRequested(), T0 + 500)
    assert again is state and effects == ()


def test_a_cancel_replaces_a_window_end_but_not_a_revocation() -> None:
    window, _ = step(running(), TimerDue(), T0 + 1_000)
    assert step(window, CancelRequested(), T0 + 1_001)[0].end_cause is EndCause.CANCEL
    revoked, effects = step(running(), Terminate("grant-revoked", erase=True), T0 + 300)
    assert revoked.end_cause is EndCause.TERMINATE and revoked.end_code == "grant-revoked"
    assert effects == (Effect.ERASE, Effect.NOTIFY, Effect.WAKE)
    assert step(revoked, CancelRequested(), T0 + 301)[0] is revoked


def test_a_revocation_during_a_cancel_still_erases_but_does_not_win() -> None:
    cancelled, _ = step(running(), CancelRequested(), T0 + 300)
    state, effects = step(cancelled, Terminate("grant-revoked", erase=True), T0 + 301)
    assert state is cancelled and effects == (Effect.ERASE, Effect.NOTIFY)


def test_finishing_cuts_the_final_revision_of_a_completing_end_and_always_stops() -> None:
    window, _ = step(running(), TimerDue(), T0 + 1_000)
    assert step(window, Finishing(), T0 + 1_000)[1] == (Effect.FINAL_CUT, Effect.STOP_PROVIDER)
    restarted, _ = step(running(), ProviderFailed(PROVIDER_RESTARTED), T0 + 300)
    assert step(restarted, Finishing(), T0 + 300)[1] == (Effect.ERASE, Effect.STOP_PROVIDER)
    cancelled, _ = step(running(), CancelRequested(), T0 + 300)
    assert step(cancelled, Finishing(), T0 + 300)[1] == (Effect.STOP_PROVIDER,)


def test_a_confirmed_stop_of_a_window_end_completes_with_the_final_revision() -> None:
    window, _ = step(running(), TimerDue(), T0 + 1_000)
    state, effects = step(window, Stopped(StopResult.ACKNOWLEDGED, revision=4), T0 + 1_050)
    assert state.status is Status.COMPLETED and state.reason == "window-complete"
    assert state.final_revision == 4 and state.cleanup is CleanupState.CONFIRMED
    assert state.terminal_at_ms == T0 + 1_050 == state.state_changed_at_ms
    assert effects == (Effect.NOTIFY, Emit("ended"))


def test_an_uncertain_stop_of_a_cancel_fails_and_drops_the_candidates() -> None:
    cancelled, _ = step(running(), CancelRequested(), T0 + 300)
    state, effects = step(cancelled, Stopped(StopResult.UNCERTAIN, revision=2), T0 + 800)
    assert state.status is Status.FAILED and state.error_code == CANCELLATION_UNCONFIRMED
    assert state.cancellation is CancellationState.UNCERTAIN and state.cleanup is CleanupState.UNCERTAIN
    assert state.final_revision == 0 and state.cancellation_confirmed_at_ms is None
    assert effects == (Effect.ERASE, Effect.NOTIFY, Emit("ended"))
    late, effects = step(state, StoppedLate(StopResult.ACKNOWLEDGED), T0 + 2_000)
    assert late.cleanup is CleanupState.CONFIRMED and late.status is Status.FAILED
    assert late.state_changed_at_ms == T0 + 2_000 and effects == (Effect.NOTIFY, Emit("cleanup-confirmed"))


def test_a_confirmed_cancel_records_when_it_was_confirmed() -> None:
    cancelled, _ = step(running(), CancelRequested(), T0 + 300)
    state, _ = step(cancelled, Stopped(StopResult.PROVEN, revision=2), T0 + 450)
    assert state.status is Status.CANCELLED and state.cancellation is CancellationState.CONFIRMED
    assert state.cancellation_confirmed_at_ms == T0 + 450 and state.diagnostics == ("stop-by-disconnect",)


def test_a_start_cut_off_by_the_timeout_or_the_expiry_ends_from_pending() -> None:
    pending = initial_state(spec())
    timed_out, effects = step(pending, StartFailed(cut=True), T0 + 5_000)
    assert timed_out.status is Status.FAILED and timed_out.error_code == DEADLINE_EXCEEDED
    assert effects == (Effect.ERASE, Effect.NOTIFY, Emit("ended"))
    expired, _ = step(pending, StartFailed(cut=True), T0 + 9_000)
    assert expired.status is Status.EXPIRED
    refused, _ = step(pending, StartFailed("provider-unavailable", detail="no adapter"), T0 + 5)
    assert refused.error_code == "provider-unavailable" and refused.error_detail == "no adapter"
    unconfirmed, _ = step(pending, StartFailed("provider-failure", stop=StopResult.UNCERTAIN), T0 + 5)
    assert unconfirmed.cleanup is CleanupState.UNCERTAIN


def test_a_cancel_during_the_start_keeps_it_pending_and_ends_cancelled() -> None:
    cancelled, _ = step(initial_state(spec()), CancelRequested(), T0 + 5)
    started, effects = step(cancelled, Started(), T0 + 50)
    assert started.status is Status.PENDING and effects == ()
    state, _ = step(started, Stopped(StopResult.ACKNOWLEDGED, revision=0), T0 + 60)
    assert state.status is Status.CANCELLED
    refused, _ = step(cancelled, StartFailed("provider-unavailable"), T0 + 50)
    assert refused.status is Status.CANCELLED


def test_the_lifecycle_table_refuses_a_move_it_does_not_have() -> None:
    # A completing end concluded before the session ever ran: pending -> completed is not an edge.
    window, _ = step(initial_state(spec()), EndRequested(EndCause.WINDOW), T0 + 10)
    with pytest.raises(IllegalTransition):
        step(window, Stopped(StopResult.ACKNOWLEDGED, revision=0), T0 + 20)


def test_nothing_ends_a_terminal_session_again() -> None:
    window, _ = step(running(), TimerDue(), T0 + 1_000)
    done, _ = step(window, Stopped(StopResult.ACKNOWLEDGED, revision=1), T0 + 1_010)
    for event in (CancelRequested(), Terminate("grant-revoked", erase=True), ProviderFailed("x"), TimerDue()):
        assert step(done, event, T0 + 1_020) == (done, ())


def test_an_internal_failure_erases_and_stops_unless_already_terminal() -> None:
    state, effects = step(running(), InternalFailure(), T0 + 100)
    assert state.end_cause is EndCause.FAILURE and effects == (Effect.ERASE, Effect.STOP_PROVIDER)
    window, _ = step(running(), TimerDue(), T0 + 1_000)
    done, _ = step(window, Stopped(StopResult.ACKNOWLEDGED, revision=1), T0 + 1_010)
    assert step(done, InternalFailure(), T0 + 1_020) == (done, (Effect.ERASE,))


def test_retention_erases_once() -> None:
    state, effects = step(running(), EraseResult(), T0 + 100)
    assert state.erased_at_ms == T0 + 100 and effects == (Effect.ERASE, Effect.NOTIFY)
    assert step(state, EraseResult(), T0 + 200) == (state, ())


def test_the_runner_wakes_at_the_next_deadline_or_cut_never_sooner_than_the_spin_guard() -> None:
    session = spec()
    assert start_deadline_ms(session) == T0 + 5_000
    assert start_deadline_ms(replace(session, timeout_at_ms=None, expires_at_ms=None)) is None
    assert next_wake_ms(session, None, T0) == T0 + 1_000
    assert next_wake_ms(session, T0 + 300, T0 + 100) == T0 + 300
    assert next_wake_ms(session, T0, T0 + 100) == T0 + 100 + MIN_WAKE_MS
