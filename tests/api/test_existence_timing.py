"""Issue D10: another principal's operation and a never-seen id take the same path (the same calls).

That both also take the same time is measured, not asserted: `bench/existence_timing.py`.
"""

from __future__ import annotations

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
