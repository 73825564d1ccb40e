"""Console sessions and CSRF tokens: server-side, expiring, bounded, with a moving clock instead of sleeps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import count

from connector.api.console import ConsoleSessions, csrf_matches

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def numbered() -> ConsoleSessions:
    """Sessions whose random values are predictable, to check what is stored."""
    numbers = count(1)
    return ConsoleSessions(entropy=lambda _: f"value-{next(numbers)}", capacity=3)


def test_a_session_is_found_by_its_cookie_only() -> None:
    sessions = ConsoleSessions()
    cookie, session = sessions.open("operator-1", "tok", T0)
    assert sessions.find(cookie, T0) == session
    assert sessions.find(cookie + "x", T0) is None
    assert sessions.find("", T0) is None
    assert sessions.find(None, T0) is None
    assert len(cookie) >= 43 and len(session.csrf_token) >= 43 and cookie != session.csrf_token


def test_cookies_and_csrf_tokens_are_fresh_per_session() -> None:
    sessions = ConsoleSessions()
    first, one = sessions.open("operator-1", "tok", T0)
    second, two = sessions.open("operator-1", "tok", T0)
    assert first != second and one.csrf_token != two.csrf_token
    assert len(sessions) == 2


def test_the_store_keeps_digests_of_cookies_never_the_cookies() -> None:
    sessions = numbered()
    cookie, _ = sessions.open("operator-1", "tok", T0)
    assert cookie == "value-1"
    assert "value-1" not in sessions._sessions  # stored under SHA-256, so a memory dump holds no cookie


def test_the_session_repr_holds_no_secret() -> None:
    _, session = ConsoleSessions().open("operator-1", "secret-token", T0)
    assert "secret-token" not in repr(session) and session.csrf_token not in repr(session)


def test_idle_sessions_expire_after_eight_hours_and_activity_extends_them() -> None:
    sessions = ConsoleSessions()
    cookie, _ = sessions.open("operator-1", "tok", T0)
    active = T0 + timedelta(hours=7, minutes=59)
    assert sessions.find(cookie, active) is not None
    assert sessions.find(cookie, active + timedelta(hours=7, minutes=59)) is not None
    assert sessions.find(cookie, active + timedelta(hours=16)) is None
    assert len(sessions) == 0  # an expired session is gone, not just hidden


def test_an_idle_session_is_refused_at_exactly_its_limit() -> None:
    sessions = ConsoleSessions(idle=timedelta(minutes=10))
    cookie, _ = sessions.open("operator-1", "tok", T0)
    assert sessions.find(cookie, T0 + timedelta(minutes=10)) is None


def test_even_an_active_session_ends_at_its_absolute_limit() -> None:
    sessions = ConsoleSessions()
    cookie, _ = sessions.open("operator-1", "tok", T0)
    for hour in range(1, 24):
        assert sessions.find(cookie, T0 + timedelta(hours=hour)) is not None
    assert sessions.find(cookie, T0 + timedelta(hours=24)) is None


def test_expire_drops_only_stale_sessions() -> None:
    sessions = ConsoleSessions()
    old, _ = sessions.open("operator-1", "tok", T0)
    fresh, _ = sessions.open("operator-2", "tok", T0 + timedelta(hours=5))
    assert sessions.expire(T0 + timedelta(hours=9)) == 1
    assert sessions.find(fresh, T0 + timedelta(hours=9)) is not None
    assert sessions.find(old, T0 + timedelta(hours=9)) is None


def test_the_population_is_bounded_by_evicting_the_least_recently_seen() -> None:
    sessions = numbered()
    a, _ = sessions.open("a", "tok", T0)
    b, _ = sessions.open("b", "tok", T0 + timedelta(minutes=1))
    c, _ = sessions.open("c", "tok", T0 + timedelta(minutes=2))
    assert sessions.find(a, T0 + timedelta(minutes=3)) is not None  # a is now the most recent
    d, _ = sessions.open("d", "tok", T0 + timedelta(minutes=4))
    later = T0 + timedelta(minutes=5)
    assert len(sessions) == 3
    assert sessions.find(b, later) is None
    assert all(sessions.find(cookie, later) is not None for cookie in (a, c, d))


def test_closing_ends_a_session_and_tolerates_unknown_cookies() -> None:
    sessions = ConsoleSessions()
    cookie, _ = sessions.open("operator-1", "tok", T0)
    sessions.close("not-a-session")
    sessions.close(None)
    assert sessions.find(cookie, T0) is not None
    sessions.close(cookie)
    assert sessions.find(cookie, T0) is None


def test_a_notice_is_shown_once() -> None:
    sessions = ConsoleSessions()
    cookie, _ = sessions.open("operator-1", "tok", T0)
    assert sessions.take_notice(cookie) is None
    sessions.put_notice(cookie, "Cancel requested.")
    assert sessions.take_notice(cookie) == "Cancel requested."
    assert sessions.take_notice(cookie) is None
    sessions.put_notice("not-a-session", "ignored")
    assert sessions.take_notice("not-a-session") is None


def test_csrf_tokens_must_match_exactly() -> None:
    assert csrf_matches("abc123", "abc123")
    assert not csrf_matches("abc123", "abc124")
    assert not csrf_matches("abc123", "abc12")
    assert not csrf_matches("abc123", "")
    assert not csrf_matches("abc123", None)
