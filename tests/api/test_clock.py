"""One clock: the service, the discovery runtime and the command runner all read the clock `assemble` gets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.api.support import REDACT, RecordingFactory, harness, straps
from tests.runtime.sessions import metadata_of
from tests.support.clocks import OffsetClock
from tests.support.directives import command_directive, scan_directive

BEHIND = timedelta(hours=2)


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.realtime  # a command subprocess
@pytest.mark.asyncio
async def test_scans_and_commands_are_stamped_by_the_injected_clock(tmp_path: Path) -> None:
    clock = OffsetClock(offset=-BEHIND)
    async with harness(tmp_path, factory=RecordingFactory(straps(2)), clock=clock) as h:
        scan = (await h.invoke("alice", scan_directive(1))).headers["location"]
        command = (await h.invoke("alice", command_directive(REDACT, "async", {"text": "x"}))).headers[
            "location"
        ]
        scanned = (await h.poll("alice", scan))[-1]
        commanded = (await h.poll("alice", command))[-1]
        metadata = metadata_of(h.assembled.discovery, scan.rsplit("/", 1)[1])
    assert (scanned["status"], commanded["status"]) == ("completed", "completed")
    # The wall clock is two hours ahead of the injected one: every stamp follows the injected clock.
    ahead = datetime.now(UTC) - BEHIND / 2
    assert _parse(metadata["updated_at"]) < ahead and _parse(metadata["created_at"]) < ahead
    assert _parse(commanded["updated_at"]) < ahead
