"""Host policy: defaults, configuration refusals, and the narrowing properties of CONTRACT §3."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connector.contract.canonical import canonical_bytes
from connector.core.policy import DeferredHostPolicy, PolicyError, discovery_window_end
from connector.errors import SensoriumError

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)


@st.composite
def policies(draw: st.DrawFn) -> DeferredHostPolicy:
    low = draw(st.integers(0, 120))
    return DeferredHostPolicy(
        min_retry_after_seconds=low,
        max_retry_after_seconds=draw(st.integers(low, 600)),
        max_ttl_seconds=draw(st.integers(1, 7 * 86400)),
        jitter_fraction=draw(st.floats(0, 1, exclude_max=True)),
    )


hints = st.integers(-10_000, 10_000)
units = st.floats(0, 1, exclude_max=True)
seconds = st.none() | st.integers(0, 10 * 86400)
moments = st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2030, 1, 1), timezones=st.just(UTC))


def test_defaults_follow_spec() -> None:
    policy = DeferredHostPolicy()
    assert (policy.min_retry_after_seconds, policy.max_retry_after_seconds) == (1, 60)
    assert (policy.max_ttl_seconds, policy.max_attempts) == (900, 1000)
    assert (policy.max_response_bytes, policy.max_operations_per_principal) == (262144, 16)
    assert policy.jitter_fraction == pytest.approx(0.10)
    assert policy.max_live_sessions == 64
    assert DeferredHostPolicy.from_mapping({}) == policy


def test_from_mapping_overrides() -> None:
    policy = DeferredHostPolicy.from_mapping({"max_ttl_seconds": 60, "jitter_fraction": 0})
    assert policy.max_ttl_seconds == 60
    assert policy.jitter_fraction == 0
    assert policy.max_attempts == 1000


def test_live_sessions_are_capped_from_configuration() -> None:
    policy = DeferredHostPolicy.from_mapping({"max_live_sessions": 2})
    assert [policy.admits_another_session(n) for n in (0, 1, 2, 3)] == [True, True, False, False]


def test_policy_is_frozen() -> None:
    policy = DeferredHostPolicy()
    with pytest.raises(AttributeError):
        policy.max_ttl_seconds = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("config", "rule", "path"),
    [
        ({"max_ttl": 5}, "unknown-key", "/max_ttl"),
        ({"min_retry_after_seconds": -1}, "out-of-range", "/min_retry_after_seconds"),
        ({"max_retry_after_seconds": -3}, "out-of-range", "/max_retry_after_seconds"),
        ({"min_retry_after_seconds": 61}, "min-above-max", "/min_retry_after_seconds"),
        ({"max_ttl_seconds": 0}, "out-of-range", "/max_ttl_seconds"),
        ({"max_attempts": 0}, "out-of-range", "/max_attempts"),
        ({"max_response_bytes": 0}, "out-of-range", "/max_response_bytes"),
        ({"max_operations_per_principal": -5}, "out-of-range", "/max_operations_per_principal"),
        ({"max_live_sessions": 0}, "out-of-range", "/max_live_sessions"),
        ({"max_live_sessions": 8.0}, "not-an-integer", "/max_live_sessions"),
        ({"max_attempts": True}, "not-an-integer", "/max_attempts"),
        ({"max_attempts": 10.0}, "not-an-integer", "/max_attempts"),
        ({"max_ttl_seconds": "900"}, "not-an-integer", "/max_ttl_seconds"),
        ({"max_ttl_seconds": None}, "not-an-integer", "/max_ttl_seconds"),
        ({"jitter_fraction": 1.0}, "out-of-range", "/jitter_fraction"),
        ({"jitter_fraction": -0.1}, "out-of-range", "/jitter_fraction"),
        ({"jitter_fraction": math.nan}, "out-of-range", "/jitter_fraction"),
        ({"jitter_fraction": True}, "out-of-range", "/jitter_fraction"),
        ({"jitter_fraction": "0.1"}, "out-of-range", "/jitter_fraction"),
    ],
)
def test_from_mapping_refusals(config: dict[str, object], rule: str, path: str) -> None:
    with pytest.raises(PolicyError) as info:
        DeferredHostPolicy.from_mapping(config)
    error = info.value
    assert isinstance(error, SensoriumError)
    assert error.code == "invalid-policy"
    assert {"code": rule, "message": path} in error.diagnostics
    # Diagnostics carry key paths and rule names, never the configured values.
    for value in config.values():
        if isinstance(value, str):
            assert value not in error.message
            assert all(value not in d["message"] for d in error.diagnostics)


def test_refusals_are_all_reported_at_once() -> None:
    with pytest.raises(PolicyError) as info:
        DeferredHostPolicy.from_mapping({"max_attempts": 0, "max_ttl_seconds": -1, "bogus": 1})
    paths = {d["message"] for d in info.value.diagnostics}
    assert paths == {"/bogus"}  # unknown keys are refused before any value is looked at
    with pytest.raises(PolicyError) as info:
        DeferredHostPolicy(max_attempts=0, max_ttl_seconds=-1)
    assert {d["message"] for d in info.value.diagnostics} == {"/max_attempts", "/max_ttl_seconds"}


def test_direct_construction_is_validated_too() -> None:
    with pytest.raises(PolicyError):
        DeferredHostPolicy(min_retry_after_seconds=10, max_retry_after_seconds=5)


@pytest.mark.parametrize(
    ("hint", "unit", "expected"),
    [
        (0, 0.0, 1),
        (-5, 0.0, 1),
        (1, 0.99, 1),
        (30, 0.0, 30),
        (30, 0.5, 31),
        (30, 0.99, 32),
        (59, 0.99, 60),
        (60, 0.99, 60),
        (3600, 0.5, 60),
    ],
)
def test_effective_retry_after_examples(hint: int, unit: float, expected: int) -> None:
    assert DeferredHostPolicy().effective_retry_after(hint, unit) == expected


@pytest.mark.parametrize("unit", [-0.1, 1.0, math.nan])
def test_effective_retry_after_refuses_bad_jitter_unit(unit: float) -> None:
    with pytest.raises(ValueError):
        DeferredHostPolicy().effective_retry_after(10, unit)


@given(policies(), hints, units)
def test_retry_after_within_bounds_and_jitter(policy: DeferredHostPolicy, hint: int, unit: float) -> None:
    value = policy.effective_retry_after(hint, unit)
    clamped = min(max(hint, policy.min_retry_after_seconds), policy.max_retry_after_seconds)
    assert isinstance(value, int)
    assert policy.min_retry_after_seconds <= value <= policy.max_retry_after_seconds
    assert clamped <= value <= clamped + clamped * policy.jitter_fraction
    assert value == policy.effective_retry_after(hint, unit)


@given(policies(), hints)
def test_retry_after_without_jitter_is_the_clamp(policy: DeferredHostPolicy, hint: int) -> None:
    clamped = min(max(hint, policy.min_retry_after_seconds), policy.max_retry_after_seconds)
    assert policy.effective_retry_after(hint, 0.0) == clamped


def test_expires_at_examples() -> None:
    policy = DeferredHostPolicy()
    none = policy.effective_expires_at(
        NOW, connector_fail_after=None, preferred_max_ttl=None, caller_deadline=None
    )
    assert none == NOW + timedelta(seconds=900)
    assert policy.effective_expires_at(
        NOW, connector_fail_after=120, preferred_max_ttl=300, caller_deadline=NOW + timedelta(seconds=200)
    ) == NOW + timedelta(seconds=120)
    assert policy.effective_expires_at(
        NOW, connector_fail_after=5000, preferred_max_ttl=None, caller_deadline=NOW + timedelta(hours=5)
    ) == NOW + timedelta(seconds=900)
    assert (
        policy.effective_expires_at(
            NOW, connector_fail_after=None, preferred_max_ttl=None, caller_deadline=NOW - timedelta(seconds=3)
        )
        == NOW
    )


def test_present_zero_is_not_absent() -> None:
    # CONTRACT §3 writes `ttl or max_ttl`; a zero hint must still narrow, never fall back to max_ttl.
    got = DeferredHostPolicy().effective_expires_at(
        NOW, connector_fail_after=0, preferred_max_ttl=None, caller_deadline=None
    )
    assert got == NOW


def test_expires_at_floors_to_milliseconds() -> None:
    now = NOW.replace(microsecond=123_456)
    got = DeferredHostPolicy().effective_expires_at(
        now,
        connector_fail_after=None,
        preferred_max_ttl=None,
        caller_deadline=now + timedelta(microseconds=2_999),
    )
    assert got == NOW.replace(microsecond=126_000)


def test_expires_at_needs_aware_datetimes() -> None:
    policy = DeferredHostPolicy()
    with pytest.raises(ValueError):
        policy.effective_expires_at(
            NOW.replace(tzinfo=None), connector_fail_after=None, preferred_max_ttl=None, caller_deadline=None
        )
    with pytest.raises(ValueError):
        policy.effective_expires_at(
            NOW, connector_fail_after=None, preferred_max_ttl=None, caller_deadline=NOW.replace(tzinfo=None)
        )


@given(policies(), moments, seconds, seconds, st.none() | moments)
def test_expires_at_only_narrows(
    policy: DeferredHostPolicy,
    now: datetime,
    fail_after: int | None,
    preferred: int | None,
    deadline: datetime | None,
) -> None:
    alone = policy.effective_expires_at(
        now, connector_fail_after=None, preferred_max_ttl=None, caller_deadline=None
    )
    got = policy.effective_expires_at(
        now, connector_fail_after=fail_after, preferred_max_ttl=preferred, caller_deadline=deadline
    )
    assert now - timedelta(milliseconds=1) < got <= alone <= now + timedelta(seconds=policy.max_ttl_seconds)
    for hint in (fail_after, preferred):
        if hint is not None:
            assert got <= now + timedelta(seconds=hint)
    if deadline is not None:
        assert got <= max(deadline, now)
    # Adding one more hint never extends what the others gave.
    fewer = policy.effective_expires_at(
        now, connector_fail_after=fail_after, preferred_max_ttl=None, caller_deadline=None
    )
    assert got <= fewer
    assert got.microsecond % 1000 == 0


def test_status_fits_attempts_and_room() -> None:
    policy = DeferredHostPolicy(max_response_bytes=100, max_attempts=3, max_operations_per_principal=2)
    exact = {"s": "x" * (100 - len(b'{"s":""}'))}  # canonical JSON of exactly 100 bytes
    assert len(canonical_bytes(exact)) == 100
    assert policy.status_fits(exact)
    assert not policy.status_fits({"s": exact["s"] + "x"})
    assert not policy.status_fits({"s": exact["s"][1:] + "\u00e9"}), "bytes, not characters"
    assert not policy.attempts_exhausted(2)
    assert policy.attempts_exhausted(3)
    assert policy.admits_another_operation(1)
    assert not policy.admits_another_operation(2)


def test_window_end_examples() -> None:
    assert discovery_window_end(NOW, 30, None, 2000) == (NOW + timedelta(seconds=30), False)
    far = NOW + timedelta(seconds=60)
    assert discovery_window_end(NOW, 30, far, 2000) == (NOW + timedelta(seconds=30), False)
    exact = NOW + timedelta(seconds=33)  # the window's end + cleanup 2 s + proof 1 s (CONTRACT §3, 6.7)
    assert discovery_window_end(NOW, 30, exact, 2000) == (NOW + timedelta(seconds=30), False)
    near = NOW + timedelta(seconds=13)
    assert discovery_window_end(NOW, 30, near, 2000) == (NOW + timedelta(seconds=10), True)
    one_short = NOW + timedelta(seconds=32)
    assert discovery_window_end(NOW, 30, one_short, 2000) == (NOW + timedelta(seconds=29), True)
    passed = NOW + timedelta(seconds=1)
    assert discovery_window_end(NOW, 30, passed, 2000) == (NOW, True)


def test_window_end_refuses_negative_lengths() -> None:
    with pytest.raises(ValueError):
        discovery_window_end(NOW, -1, None, 2000)
    with pytest.raises(ValueError):
        discovery_window_end(NOW, 30, None, -1)


def test_window_end_needs_aware_datetimes() -> None:
    with pytest.raises(ValueError):
        discovery_window_end(NOW.replace(tzinfo=None), 30, None, 2000)
    with pytest.raises(ValueError):
        discovery_window_end(NOW, 30, NOW.replace(tzinfo=None), 2000)


@given(moments, st.integers(1, 3600), st.none() | moments, st.integers(0, 60_000))
def test_window_end_within_bounds(
    start: datetime, window: int, deadline: datetime | None, cleanup: int
) -> None:
    end, cut = discovery_window_end(start, window, deadline, cleanup)
    own_end = start + timedelta(seconds=window)
    assert start <= end <= own_end
    if deadline is None:
        assert (end, cut) == (own_end, False)
        return
    budget = deadline - timedelta(milliseconds=cleanup)
    assert cut == (budget < own_end)
    if cut:
        assert end == max(budget, start)
