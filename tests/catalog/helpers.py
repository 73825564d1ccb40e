"""Shared values for the catalog tests: the test clock and a canary."""

from __future__ import annotations

from datetime import UTC, datetime

# Inside the shipped catalog's validity window.
NOW = datetime(2027, 1, 1, tzinfo=UTC)
CANARY = "CANARY-7f3e9b21-do-not-echo"


def error_text(error: BaseException) -> str:
    """Everything a refusal could show anyone: its string, message and diagnostics."""
    message = getattr(error, "message", "")
    diagnostics = getattr(error, "diagnostics", ())
    return f"{error!s} {message} {diagnostics!r} {error!r}"
