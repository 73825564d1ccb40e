"""Issue D10: another principal's operation and a never-seen id take the same path and the same time."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from connector.core.ids import OPERATION_KIND, random_operation_id
from tests.api.support import RecordingFactory, assert_error, harness, straps
from tests.support.directives import scan_directive

pytestmark = pytest.mark.asyncio


async def test_both_ids_make_the_same_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(1), concurrent=True)) as h:
        accepted = await h.invoke("alice", scan_directive(30))
        theirs = accepted.headers["location"]
        never = "/v1/operations/" + random_operation_id(OPERATION_KIND, bytes(16))
        calls: list[str] = []
        service = h.assembled.service

        def spy(name: str, target: Any) -> None:
            original = getattr(target, name)

            def wrapped(*args: Any, **kwargs: Any) -> Any:
                calls.append(name)
                return original(*args, **kwargs)

            monkeypatch.setattr(target, name, wrapped)

        for name, target in (
            ("locate", service.state),
            ("get_discovery", service.state),
            ("session", service.discovery),
            ("operation", service.commands),
        ):
            spy(name, target)
        traces = []
        for path in (theirs, never, theirs, never):
            calls.clear()
            assert_error(await h.get("bob", path), 404, "unknown-operation")
            traces.append(list(calls))
        assert traces[0] == traces[1] == traces[2] == traces[3] == ["locate", "session"]


async def test_the_two_latency_distributions_match(tmp_path: Path) -> None:
    """Paired, interleaved samples: the median paired difference is within 10 % of the median latency.

    Before the fix, another principal's in-memory scan answered without the database read a never-seen
    id needed (0.69 vs 0.85 ms, about 20 %).
    """
    async with harness(tmp_path, factory=RecordingFactory(straps(1), concurrent=True)) as h:
        theirs = (await h.invoke("alice", scan_directive(30))).headers["location"]
        never = "/v1/operations/" + random_operation_id(OPERATION_KIND, bytes(range(16)))
        headers = h.auth("bob")

        async def timed(path: str) -> float:
            started = time.perf_counter()
            response = await h.client.get(path, headers=headers)
            elapsed = time.perf_counter() - started
            assert response.status_code == 404
            return elapsed

        for _ in range(30):  # warm-up
            await timed(theirs)
            await timed(never)
        differences, latencies = [], []
        for index in range(400):
            first, second = (theirs, never) if index % 2 else (never, theirs)
            a, b = await timed(first), await timed(second)
            t_theirs, t_never = (a, b) if first == theirs else (b, a)
            differences.append(t_theirs - t_never)
            latencies += [t_theirs, t_never]
        assert abs(statistics.median(differences)) <= 0.10 * statistics.median(latencies)
