"""Helpers for the recorder tests: candidate tables fed by a provider, candidate content, the CLI."""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from connector.cli import fixtures_cmd
from connector.cli.recorder import FixtureFile
from connector.core.observations import Observation
from connector.core.scope import DiscoveryProfile, DiscoveryScope
from connector.core.snapshot import CandidateTable
from connector.errors import ProviderError
from tests.support.paths import REPO

ENV_SENSING = "0000181a-0000-1000-8000-00805f9b34fb"
# The command alone, as `sensorium-connector` would parse it (other subcommands are not needed here).
CLI_SCRIPT = """
import argparse, sys
from connector.cli import fixtures_cmd
from tests.support.directives import HEART_RATE
parser = argparse.ArgumentParser(prog="sensorium-connector")
fixtures_cmd.register(parser.add_subparsers(dest="command", required=True))
args = parser.parse_args(sys.argv[1:])
sys.exit(args.handler(args))
"""

PROFILE = DiscoveryProfile(
    transports=("ble", "usb-serial", "mdns"),
    max_window_seconds=60,
    max_candidates=64,
    max_snapshot_bytes=65536,
    min_revision_interval_ms=50,
    max_revisions=1000,
    candidate_ttl_seconds=30,
    cleanup_timeout_ms=1000,
)


class WatchedFixture(FixtureFile):
    """A fixture file that also keeps the lines it is given, so a test can wait for one to be recorded."""

    def __init__(self, target: Path) -> None:
        super().__init__(target)
        self.lines: list[dict[str, Any]] = []

    def write(self, line: Mapping[str, Any]) -> None:
        """Keep the line, then append it to the file."""
        self.lines.append(dict(line))
        super().write(line)

    def holds(self, **fields: object) -> bool:
        """True once a recorded line carries every one of `fields`."""
        return any(all(line.get(k) == v for k, v in fields.items()) for line in self.lines)


class TableSink:
    """An ObservationSink feeding a session's candidate table, as the runtime does."""

    def __init__(self, scope: DiscoveryScope) -> None:
        self.table = CandidateTable(scope, PROFILE, generation="g", new_ref=lambda: secrets.token_hex(8))
        self.observations: list[Observation] = []
        self.failures: list[ProviderError] = []

    def observe(self, observation: Observation) -> None:
        """Apply one observation now."""
        self.observations.append(observation)
        self.table.ingest(observation, time.time_ns() // 1_000_000)

    def fail(self, error: ProviderError) -> None:
        """Record a provider failure."""
        self.failures.append(error)

    def candidates(self) -> list[dict[str, Any]]:
        """The candidate documents of a final cut (the last revision when nothing changed since)."""
        self.table.cut(time.time_ns() // 1_000_000, final=True)
        latest = self.table.latest
        return [] if latest is None else list(latest.candidates)


def content(candidates: Sequence[dict[str, Any]]) -> list[str]:
    """What a caller learns about each device (labels, uuids, manufacturer ids, rssi), sorted, comparable."""
    keep = ("label", "signal", "ble", "usb", "mdns", "transport")
    return sorted(json.dumps({k: c[k] for k in keep if k in c}, sort_keys=True) for c in candidates)


def run_cli(argv: Sequence[str]) -> int:
    """`sensorium-connector fixtures ...` in this process."""
    parser = argparse.ArgumentParser(prog="sensorium-connector")
    fixtures_cmd.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    code: int = args.handler(args)
    return code


def spawn_cli(argv: Sequence[str]) -> subprocess.Popen[str]:
    """`sensorium-connector fixtures ...` in a child process (stderr piped, text mode)."""
    return subprocess.Popen(
        [sys.executable, "-c", CLI_SCRIPT, *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def fixture_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a fixture file, parsed."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
