"""The one time module: epoch milliseconds and the RFC 3339 spelling round-trip exactly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from connector.core.clock import format_time, from_ms, parse_time, to_ms, wall_clock, wall_clock_ms

PLUS_TWO = timezone(timedelta(hours=2))


@pytest.mark.parametrize(
    ("moment", "ms"),
    [
        (datetime(1970, 1, 1, tzinfo=UTC), 0),
        (datetime(2026, 3, 1, 12, 0, 0, 123999, tzinfo=UTC), 1772366400123),
        # A float timestamp would read 1700000000.1229999 here; the integer arithmetic does not.
        (datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC), 1700000000123),
        (datetime(2026, 3, 1, 14, 0, 0, 5000, tzinfo=PLUS_TWO), 1772366400005),
    ],
)
def test_to_ms_floors_exactly(moment: datetime, ms: int) -> None:
    assert to_ms(moment) == ms
    assert from_ms(ms) == moment.replace(microsecond=moment.microsecond // 1000 * 1000)


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        (datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC), "2026-03-01T12:00:00.000Z"),
        (datetime(2026, 3, 1, 12, 0, 0, 999999, tzinfo=UTC), "2026-03-01T12:00:00.999Z"),
        (datetime(2026, 3, 1, 14, 0, 0, 5000, tzinfo=PLUS_TWO), "2026-03-01T12:00:00.005Z"),
    ],
)
def test_format_time_whole_milliseconds_in_utc(moment: datetime, text: str) -> None:
    assert format_time(moment) == text
    assert parse_time(text) == moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def test_parse_time_accepts_whole_seconds_and_any_fraction() -> None:
    assert parse_time("2026-03-01T12:00:00Z") == datetime(2026, 3, 1, 12, tzinfo=UTC)
    assert parse_time("2026-03-01T12:00:00.5Z") == datetime(2026, 3, 1, 12, 0, 0, 500000, tzinfo=UTC)


def test_wall_clocks_agree_and_are_aware() -> None:
    before = wall_clock()
    ms = wall_clock_ms()
    after = wall_clock()
    assert before.tzinfo is UTC
    assert to_ms(before) <= ms <= to_ms(after)
