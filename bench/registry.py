"""Registry benchmark: one persisted status transition vs a bare aiosqlite insert; the poller's CPU per 1,000.

1. `transition`: `DeferredRegistry.record_status` moving an accepted operation `pending -> running` with new
   durable metadata (the row UPDATE plus the history event its trigger appends, one statement, WAL,
   `synchronous=FULL`) against `bare`: one aiosqlite `INSERT` of a row of the same size into a one-table
   database with the same pragmas. Both run in the same process, in turns (with a third contender: the
   transition's SQL statement alone, parameters prepared untimed, to show where the time goes), after an
   untimed warm-up that brings both WAL files to their reused steady state; the figures are the median
   per-operation wall times and their ratio.
2. `poller`: `HostService.poll_due` over 1,000 due operations (a scripted in-memory connector that answers
   `running` with unchanged metadata, so each poll is one row update), measured with `time.process_time`
   (every thread of the process, aiosqlite's included) and wall time, over several passes.

Usage: `.venv/bin/python bench/registry.py [--rounds 7] [--per-round 200] [--due 1000] [--passes 5]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import aiosqlite

# The repo root instead of this folder: a script named after a stdlib module would shadow it
# (as `bench/http.py` once shadowed `http`).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.pop(1)  # run as `python bench/registry.py`, entry 1 is this folder

from connector.contract.canonical import canonical_bytes
from connector.core.admission import Identified
from connector.core.authority import Principal, authenticate
from connector.core.ids import OPERATION_KIND, random_operation_id
from connector.core.lifecycle import Status
from connector.core.policy import DeferredHostPolicy
from connector.host.metrics import HostMetrics
from connector.host.port import ActionInfo
from connector.host.service import HostService
from connector.runtime.operations import Kind, Observed
from connector.service.answers import Accepted, Done
from connector.storage import registry as registry_module
from connector.storage.registry import DeferredRegistry, OperationRecord

T0 = datetime(2027, 1, 1, 12, 0, tzinfo=UTC)


def _op_id(n: int) -> str:
    return random_operation_id(OPERATION_KIND, n.to_bytes(16, "big"))


def _metadata(op_id: str, status: str, disclosed: int = 0) -> dict[str, Any]:
    """Durable discovery metadata of a realistic size (as `durable_metadata` shapes it)."""
    return {
        "operation/id": op_id,
        "operation/kind": OPERATION_KIND,
        "owner": "alice",
        "action_id": "device.discovery.scan",
        "status": status,
        "created_at": "2027-01-01T12:00:00.000Z",
        "updated_at": "2027-01-01T12:00:01.250Z",
        "expires_at": "2027-01-01T12:05:00.000Z",
        "scope": {
            "transport": "ble",
            "window_seconds": 30,
            "limits": {"max_candidates": 64, "max_snapshot_bytes": 65536},
            "filters": {"service_uuids": ["0000180d-0000-1000-8000-00805f9b34fb"]},
        },
        "disclosed_count": disclosed,
        "cleanup": {"state": "pending", "claim": "held"},
    }


def _record(op_id: str) -> OperationRecord:
    handle = {
        "schema": "deferred-operation.v1",
        "schema/v": 1,
        "status": "deferred",
        "operation/id": op_id,
        "operation/kind": OPERATION_KIND,
        "retry_after_seconds": 1,
        "created_at": "2027-01-01T12:00:00.000Z",
        "expires_at": "2027-01-01T12:05:00.000Z",
        "status_href": f"/v1/host/operations/{op_id}",
        "cancel_href": f"/v1/host/operations/{op_id}/cancel",
        "audit/outcome-ref": f"outcome:{op_id}:1",
        "owner_module_id": "sensorium-os",
        "capability_id": "device.discovery.scan",
        "diagnostics": [],
    }
    return OperationRecord(
        operation_id=op_id,
        operation_kind=OPERATION_KIND,
        owner_module_id="sensorium-os",
        capability_id="device.discovery.scan",
        owner="alice",
        status="pending",
        retry_after_seconds=1,
        next_poll_at=T0,
        expires_at=T0 + timedelta(minutes=5),
        attempts=0,
        cancelable=True,
        cancel_unavailable_reason=None,
        correlation_id=None,
        continuation_digest=None,
        diagnostics_digest=None,
        last_error=None,
        created_at=T0,
        updated_at=T0,
        bus_op=None,
        metadata=_metadata(op_id, "pending"),
        handle=handle,
    )


def _row_bytes(record: OperationRecord) -> int:
    """Bytes the operations row holds (its text columns plus ~10 fixed-width values)."""
    text = canonical_bytes(dict(record.metadata)) + json.dumps(dict(record.handle)).encode()
    return len(text) + 64 + len(record.operation_id) * 2 + 100


async def _open_bare(path: Path) -> aiosqlite.Connection:
    db = await aiosqlite.connect(path, isolation_level=None)
    await db.execute("PRAGMA journal_mode=WAL")
    for pragma in ("synchronous=FULL", "secure_delete=ON", "foreign_keys=ON"):
        await db.execute(f"PRAGMA {pragma}")
    await db.execute("CREATE TABLE IF NOT EXISTS bare (id TEXT PRIMARY KEY, body TEXT NOT NULL)")
    return db


async def _one_transition(registry: DeferredRegistry, op_id: str) -> float:
    metadata = _metadata(op_id, "running", disclosed=3)
    later = T0 + timedelta(seconds=1)
    start = time.perf_counter()
    await registry.record_status(
        op_id, status="running", metadata=metadata, now=later, retry_after_seconds=1, next_poll_at=later
    )
    return time.perf_counter() - start


async def _one_insert(db: aiosqlite.Connection, key: str, body: str) -> float:
    start = time.perf_counter()
    await db.execute("INSERT INTO bare (id, body) VALUES (?, ?)", (key, body))
    return time.perf_counter() - start


async def _one_statement(registry: DeferredRegistry, op_id: str) -> float:
    """The transition's SQL statement alone (parameters prepared untimed): where the time goes."""
    text, digest = registry_module._metadata_columns(_metadata(op_id, "running", disclosed=3))
    running = Status.RUNNING
    params = (
        "running",
        text,
        digest,
        1,
        1,
        2,
        None,
        None,
        None,
        0,
        op_id,
        *registry_module._SOURCES[running],
    )
    start = time.perf_counter()
    await registry._db.execute_fetchall(registry_module._UPDATE_SQL[running], params)
    return time.perf_counter() - start


async def bench_transition(directory: Path, rounds: int, per_round: int) -> dict[str, float]:
    """Median per-op wall time of a transition and of a bare insert of the same row size, in turns."""
    registry = await DeferredRegistry.open(directory / "registry")
    bare = await _open_bare(directory / "bare.sqlite")
    size = _row_bytes(_record(_op_id(0)))
    body = "x" * size
    count = rounds * per_round
    ids = [_op_id(1 + i) for i in range(2 * count)]
    times: dict[str, list[float]] = {"transition": [], "bare": [], "statement": []}
    try:
        # Untimed: the accepted rows to move, and as many bare rows, so that both WAL files have been
        # checkpointed and are being reused (the steady state of a running host) when timing starts.
        for n, op_id in enumerate(ids):
            await registry.record_accepted(_record(op_id))
            await _one_insert(bare, f"warm{n}", body)
        for n in range(count):  # one of each in turn, rotating who goes first
            steps: list[tuple[str, Callable[[], Awaitable[float]]]] = [
                ("transition", partial(_one_transition, registry, ids[n])),
                ("bare", partial(_one_insert, bare, f"k{n}", body)),
                ("statement", partial(_one_statement, registry, ids[count + n])),
            ]
            for name, step in steps[n % 3 :] + steps[: n % 3]:
                times[name].append(await step())
    finally:
        await registry.aclose()
        await bare.close()
    median = {name: statistics.median(values) for name, values in times.items()}
    return {
        "row_bytes": size,
        "transition_us": median["transition"] * 1e6,
        "bare_us": median["bare"] * 1e6,
        "statement_us": median["statement"] * 1e6,
        "ratio": median["transition"] / median["bare"],
        "statement_ratio": median["statement"] / median["bare"],
        "transition_mean_us": statistics.fmean(times["transition"]) * 1e6,
        "bare_mean_us": statistics.fmean(times["bare"]) * 1e6,
        "samples": count,
    }


@dataclass
class _RunningPort:
    """A connector that answers `running` with unchanged durable metadata for every operation."""

    principals: tuple[Principal, ...] = ()

    def authenticate(self, token: str | None) -> Principal:
        return authenticate(token, self.principals)

    def action(self, action_id: str) -> ActionInfo | None:
        return ActionInfo(action_id, "discovery", 1, 300)

    def identify(
        self, principal: Principal, directive: Any, *, op_key: str | None, operations_only: bool
    ) -> Identified:
        raise NotImplementedError

    async def admit(
        self,
        principal: Principal,
        directive: Any,
        *,
        op_key: str | None,
        identified: Identified | None = None,
    ) -> Accepted | Done:
        raise NotImplementedError

    async def observe(self, operation_id: str, kind: Kind) -> Observed | None:
        return Observed("running", _metadata(operation_id, "running"))

    async def caller_status(
        self, operation_id: str, kind: Kind, *, wait_seconds: float | None, after_revision: int | None
    ) -> dict[str, Any] | None:
        return None

    async def cancel(self, operation_id: str, kind: Kind) -> tuple[bool, dict[str, Any]] | None:
        return None

    async def stop(self, operation_id: str, kind: Kind, error_code: str) -> None:
        return None


async def bench_poller(directory: Path, due: int, passes: int) -> dict[str, float]:
    """CPU and wall seconds of `poll_due` over `due` due operations, per pass."""
    registry = await DeferredRegistry.open(directory / "poller")
    host = HostService(
        _RunningPort(), registry, DeferredHostPolicy(), lambda: T0, lambda: 0.0, metrics=HostMetrics()
    )
    cpu: list[float] = []
    wall: list[float] = []
    try:
        for n in range(due):
            op_id = _op_id(1_000_000 + n)
            await registry.record_accepted(_record(op_id))
            await registry.record_status(
                op_id,
                status="running",
                metadata=_metadata(op_id, "running"),
                now=T0,
                retry_after_seconds=1,
                next_poll_at=T0,
            )
        now = T0
        for _ in range(passes):
            now += timedelta(seconds=2)  # every operation is due again (retry 1 s)
            cpu_start, wall_start = time.process_time(), time.perf_counter()
            polled = await host.poll_due(now, limit=due)
            cpu.append(time.process_time() - cpu_start)
            wall.append(time.perf_counter() - wall_start)
            assert polled == due, polled
    finally:
        await registry.aclose()
    return {
        "due": due,
        "cpu_s": statistics.median(cpu),
        "wall_s": statistics.median(wall),
        "cpu_min_s": min(cpu),
        "cpu_max_s": max(cpu),
        "passes": passes,
    }


def _environment() -> Mapping[str, str]:
    return {
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "aiosqlite": aiosqlite.__version__,
        "machine": platform.machine(),
    }


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/registry.py")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--per-round", type=int, default=200)
    parser.add_argument("--due", type=int, default=1000)
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="bench-registry-"))
    try:
        print("command: .venv/bin/python bench/registry.py " + " ".join(sys.argv[1:]))
        print("environment:", dict(_environment()))
        t = await bench_transition(directory, args.rounds, args.per_round)
        print(
            f"transition (row update + history event): median {t['transition_us']:.0f} us, "
            f"mean {t['transition_mean_us']:.0f} us; bare insert of a {t['row_bytes']:.0f}-byte row: "
            f"median {t['bare_us']:.0f} us, mean {t['bare_mean_us']:.0f} us; "
            f"ratio {t['ratio']:.2f}x (target <= 1.5x) over {t['samples']:.0f} samples each"
        )
        print(
            f"  of which the SQL statement alone (update + history trigger + RETURNING): "
            f"median {t['statement_us']:.0f} us = {t['statement_ratio']:.2f}x the bare insert"
        )
        p = await bench_poller(directory, args.due, args.passes)
        per_1000 = 1000 / p["due"]
        print(
            f"poller: {p['due']:.0f} due operations per pass, "
            f"median CPU {p['cpu_s'] * per_1000:.3f} s per 1,000 "
            f"(min {p['cpu_min_s'] * per_1000:.3f}, max {p['cpu_max_s'] * per_1000:.3f}), "
            f"wall {p['wall_s'] * per_1000:.3f} s per 1,000, {p['passes']:.0f} passes"
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
