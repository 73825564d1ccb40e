"""The endings table: precedence, time-driven causes, the one conclusion, and its diagram in the docs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from connector.core.endings import (
    COMPLETING,
    OVERRIDES,
    CancellationState,
    ClaimState,
    CleanupState,
    EndCause,
    StopResult,
    conclude,
    confirmed_late,
    due_cause,
    mermaid,
    wins,
)
from connector.core.lifecycle import Status
from connector.diagrams import main

BEGIN, END = "<!-- endings:begin -->", "<!-- endings:end -->"


def test_first_cause_wins_except_cancel_and_terminate_which_never_replace_each_other() -> None:
    assert all(wins(cause, None) for cause in EndCause)
    ordinary = [c for c in EndCause if c not in (EndCause.CANCEL, EndCause.TERMINATE)]
    for first in ordinary:
        assert not any(wins(later, first) for later in ordinary)
        assert wins(EndCause.CANCEL, first) and wins(EndCause.TERMINATE, first)
    assert not wins(EndCause.CANCEL, EndCause.TERMINATE)
    assert not wins(EndCause.TERMINATE, EndCause.CANCEL)
    assert not wins(EndCause.CANCEL, EndCause.CANCEL)
    assert set(OVERRIDES) == set(EndCause)


@pytest.mark.parametrize(
    ("now", "timeout_at", "expires_at", "expected"),
    [
        (999, None, None, None),
        (1000, None, None, EndCause.WINDOW),
        (1000, 1000, 1000, EndCause.WINDOW),  # the window first on a tie
        (900, 800, 850, EndCause.TIMEOUT),
        (900, 880, 850, EndCause.EXPIRY),
        (800, None, 800, EndCause.EXPIRY),
    ],
)
def test_due_cause_is_the_earliest_passed_deadline(
    now: int, timeout_at: int | None, expires_at: int | None, expected: EndCause | None
) -> None:
    got = due_cause(
        now, window_end_ms=1000, cut_by_deadline=False, timeout_at_ms=timeout_at, expires_at_ms=expires_at
    )
    assert got is expected
    cut = due_cause(1000, window_end_ms=1000, cut_by_deadline=True, timeout_at_ms=None, expires_at_ms=None)
    assert cut is EndCause.DEADLINE


def test_a_cancel_is_confirmed_by_an_acknowledgement_or_a_proof_and_only_the_proof_says_so() -> None:
    acked = conclude(EndCause.CANCEL, None, StopResult.ACKNOWLEDGED)
    proven = conclude(EndCause.CANCEL, None, StopResult.PROVEN)
    for ending in (acked, proven):
        assert ending.status is Status.CANCELLED and ending.error_code is None
        assert ending.cancellation is CancellationState.CONFIRMED
        assert ending.cleanup is CleanupState.CONFIRMED and ending.claim is ClaimState.RELEASED
    assert acked.diagnostics == () and proven.diagnostics == ("stop-by-disconnect",)
    uncertain = conclude(EndCause.CANCEL, None, StopResult.UNCERTAIN)
    assert (uncertain.status, uncertain.error_code) == (Status.FAILED, "cancellation-unconfirmed")
    assert uncertain.cancellation is CancellationState.UNCERTAIN
    assert uncertain.cleanup is CleanupState.UNCERTAIN and uncertain.claim is ClaimState.HELD


@pytest.mark.parametrize("cause", sorted(COMPLETING))
def test_completing_needs_a_confirmed_cleanup(cause: EndCause) -> None:
    ending = conclude(cause, None, StopResult.ACKNOWLEDGED)
    assert (ending.status, ending.reason, ending.keeps_result) == (Status.COMPLETED, cause.value, True)
    failed = conclude(cause, None, StopResult.UNCERTAIN)
    assert (failed.status, failed.error_code, failed.keeps_result) == (
        Status.FAILED,
        "cleanup-unconfirmed",
        False,
    )


def test_deadlines_keep_their_status_whatever_the_stop_gave() -> None:
    for stop in StopResult:
        assert conclude(EndCause.TIMEOUT, None, stop).status is Status.TIMED_OUT
        assert conclude(EndCause.EXPIRY, None, stop).status is Status.EXPIRED
        assert conclude(EndCause.EXPIRY, None, stop).error_code == "deadline-exceeded"


def test_failures_keep_their_code_only_with_a_confirmed_cleanup() -> None:
    assert (
        conclude(EndCause.FAILURE, "provider-restarted", StopResult.ACKNOWLEDGED).error_code
        == "provider-restarted"
    )
    crashed = conclude(EndCause.FAILURE, "provider-failure", StopResult.PROVEN)
    assert (crashed.error_code, crashed.claim, crashed.diagnostics) == (
        "provider-failure",
        ClaimState.RELEASED,
        ("stop-by-disconnect",),
    )
    assert (
        conclude(EndCause.TERMINATE, "grant-revoked", StopResult.UNCERTAIN).error_code
        == "cleanup-unconfirmed"
    )
    assert conclude(EndCause.FAILURE, None, StopResult.ACKNOWLEDGED).error_code == "provider-failure"


def test_a_late_confirmation_moves_only_cleanup_and_claim() -> None:
    ending = conclude(EndCause.CANCEL, None, StopResult.UNCERTAIN)
    assert confirmed_late(ending, StopResult.UNCERTAIN) == ending
    late = confirmed_late(ending, StopResult.PROVEN)
    assert (late.status, late.error_code, late.cancellation) == (
        ending.status,
        ending.error_code,
        ending.cancellation,
    )
    assert late.cleanup is CleanupState.CONFIRMED and late.claim is ClaimState.RELEASED
    assert late.diagnostics == ("stop-by-disconnect",)
    assert confirmed_late(late, StopResult.PROVEN).diagnostics == ("stop-by-disconnect",)


def _doc_block(repo_root: Path) -> str:
    text = (repo_root / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    match = re.fullmatch(r"\s*```mermaid\n(.*?)```\s*", block, flags=re.DOTALL)
    assert match is not None, "the endings block must hold exactly one ```mermaid fence"
    return match.group(1)


def test_doc_block_equals_generated_diagram(repo_root: Path) -> None:
    assert _doc_block(repo_root) == mermaid(), "run: python -m connector.diagrams endings"


def test_diagram_draws_every_cause_outcome_and_override() -> None:
    diagram = mermaid()
    edges = re.findall(r'^    cause_(\w+) -- "([^"]+)" --> status_(\w+)$', diagram, flags=re.MULTILINE)
    assert len(edges) == len(EndCause) * len(StopResult)
    for cause_node, label, status_node in edges:
        cause = next(c for c in EndCause if c.value.replace("-", "_") == cause_node)
        stop = StopResult(label.split(",")[0])
        code = "(code)" if cause in (EndCause.FAILURE, EndCause.TERMINATE) else None
        assert conclude(cause, code, stop).status.value.replace("-", "_") == status_node
    overrides = re.findall(r"^    cause_(\w+) -\. replaced by \.-> cause_(\w+)$", diagram, flags=re.MULTILINE)
    assert len(overrides) == sum(len(v) for v in OVERRIDES.values())


@pytest.mark.realtime  # a `python -m` subprocess
def test_module_prints_the_diagram_and_refuses_no_flag(repo_root: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "connector.diagrams", "endings"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=repo_root,
    )
    assert out.stdout == mermaid()
    with pytest.raises(SystemExit) as usage:
        main([])
    assert usage.value.code == 2
