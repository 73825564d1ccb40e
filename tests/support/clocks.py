"""Clocks tests move instead of sleeping."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta


@dataclass
class ManualClock:
    """A clock that stands still until the test moves it."""

    now: datetime

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        """Move forward; answer the new now."""
        self.now += timedelta(seconds=seconds)
        return self.now


@dataclass
class OffsetClock:
    """Wall-clock time shifted by `offset` (tests move it forward instead of sleeping)."""

    offset: timedelta = field(default_factory=timedelta)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset
