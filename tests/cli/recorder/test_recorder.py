"""The recorder against the fault-injecting provider: timing, window, failures, abort, stops, privacy."""

from __future__ import annotations

import asyncio
import logging
import stat
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from connector.cli.recorder import (
    FixtureFile,
    FixtureHeader,
    Pseudonymiser,
    Recorder,
    RecordingOutcome,
    library_versions,
    recording_scope,
)
from connector.core.observations import BleObservation, Observation
from connector.errors import ProviderUnavailable
from providers.faults import HANG, RAISE, Fault, FaultProvider
from providers.replay import load_fixture
from tests.cli.recorder.support import fixture_lines
from tests.support.directives import HEART_RATE
from tests.support.waiting import wait_until

ADDRESS = "C4:7C:8D:6A:11:22"
OTHER = "C4:7C:8D:6A:33:44"


def advert(address: str, rssi: int) -> BleObservation:
    return BleObservation(address=address, rssi=rssi, name="strap", service_uuids=(HEART_RATE,))


TIMELINE: list[tuple[int, Observation]] = [
    (0, advert(ADDRESS, -70)),
    (100, advert(OTHER, -80)),
    (300, advert(ADDRESS, -60)),
    (5000, advert(OTHER, -40)),  # after the window of every test below
]


def recorder_for(
    provider: FaultProvider, target: Path, *, keep: bool = False, cleanup_ms: int = 2000
) -> Recorder:
    scope = replace(recording_scope("ble", 1), cleanup_timeout_ms=cleanup_ms)
    header = FixtureHeader("ble", "2026-11-30T10:00:00Z", "hci0", library_versions(), "unit test")
    names = None if keep else Pseudonymiser()
    return Recorder(provider, scope, FixtureFile(target), header, pseudonymiser=names)


def files(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


@pytest.mark.asyncio
async def test_a_session_becomes_a_private_replayable_file_with_offsets(tmp_path: Path) -> None:
    target = tmp_path / "ble.jsonl"
    provider = FaultProvider(TIMELINE)
    result = await recorder_for(provider, target).run(0.6)
    assert (result.outcome, result.observations, result.written, result.stop_confirmed) == (
        RecordingOutcome.RECORDED, 3, True, True
    )
    assert provider.acknowledged_stops == 1
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 and files(tmp_path) == ["ble.jsonl"]
    header, *lines = fixture_lines(target)
    assert header["source"] == "recorded" and header["adapter"] == "hci0" and header["notes"] == "unit test"
    offsets = [line["t_ms"] for line in lines]
    assert offsets == sorted(offsets)
    # The fault provider plays on the wall timer, which counts whole milliseconds from a floored start: a
    # report may land up to 1 ms before its offset on the recorder's own clock (a loaded run saw 99 for 100).
    for got, want in zip(offsets, (0, 100, 300), strict=True):
        assert want - 1 <= got <= want + 150
    # Pseudonyms: stable within the file, never the real address.
    assert lines[0]["address"] == lines[2]["address"] != lines[1]["address"]
    assert ADDRESS not in target.read_text() and ADDRESS.lower() not in target.read_text()
    fixture = load_fixture(target)
    assert [obs.rssi for _, obs in fixture.timeline] == [-70, -80, -60]  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_kept_identities_are_written_as_seen(tmp_path: Path) -> None:
    target = tmp_path / "ble.jsonl"
    await recorder_for(FaultProvider(TIMELINE), target, keep=True).run(0.4)
    assert [line["address"] for line in fixture_lines(target)[1:]] == [ADDRESS, OTHER, ADDRESS]


@pytest.mark.asyncio
async def test_two_recordings_share_no_pseudonym(tmp_path: Path) -> None:
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    await recorder_for(FaultProvider(TIMELINE), first).run(0.2)
    await recorder_for(FaultProvider(TIMELINE), second).run(0.2)
    a = {line["address"] for line in fixture_lines(first)[1:]}
    b = {line["address"] for line in fixture_lines(second)[1:]}
    assert len(a) == len(b) == 2 and not a & b


@pytest.mark.asyncio
async def test_a_provider_that_cannot_start_leaves_no_file(tmp_path: Path) -> None:
    provider = FaultProvider(TIMELINE, fault=Fault(start_error=ProviderUnavailable("no adapter")))
    result = await recorder_for(provider, tmp_path / "ble.jsonl").run(1)
    assert result.outcome is RecordingOutcome.FAILED and not result.written
    assert result.error is not None and result.error.code == "provider-unavailable"
    assert files(tmp_path) == [] and provider.stop_calls == 0


@pytest.mark.asyncio
async def test_a_failure_mid_session_stops_the_provider_and_keeps_nothing(tmp_path: Path) -> None:
    provider = FaultProvider(TIMELINE, fault=Fault(fail_at_ms=200))
    started = asyncio.get_running_loop().time()
    result = await recorder_for(provider, tmp_path / "ble.jsonl").run(30)
    assert asyncio.get_running_loop().time() - started < 15  # the failure, not the 30 s window, ended it
    assert result.outcome is RecordingOutcome.FAILED and result.error is not None
    assert result.error.code == "provider-restarted" and result.stop_confirmed
    assert provider.acknowledged_stops == 1 and files(tmp_path) == []


@pytest.mark.asyncio
async def test_abort_confirms_the_stop_and_keeps_nothing(tmp_path: Path) -> None:
    provider = FaultProvider(TIMELINE)
    recorder = recorder_for(provider, tmp_path / "ble.jsonl")
    task = asyncio.ensure_future(recorder.run(30))
    await wait_until(lambda: recorder.observations >= 2)
    recorder.abort()
    result = await asyncio.wait_for(task, 5)
    assert (result.outcome, result.written, result.stop_confirmed) == (RecordingOutcome.ABORTED, False, True)
    assert result.observations >= 2 and provider.acknowledged_stops == 1 and files(tmp_path) == []


@pytest.mark.asyncio
async def test_cancelling_the_run_still_stops_the_provider_and_keeps_nothing(tmp_path: Path) -> None:
    provider = FaultProvider(TIMELINE)
    recorder = recorder_for(provider, tmp_path / "ble.jsonl")
    task = asyncio.ensure_future(recorder.run(30))
    await wait_until(lambda: recorder.observations >= 2)  # recording: the provider runs
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert provider.acknowledged_stops == 1 and files(tmp_path) == []


@pytest.mark.asyncio
async def test_a_refused_stop_keeps_the_complete_file_but_says_so(tmp_path: Path) -> None:
    target = tmp_path / "ble.jsonl"
    provider = FaultProvider(TIMELINE, fault=Fault(stop_plan=(RAISE,)))
    result = await recorder_for(provider, target).run(0.4)
    await provider.unplug()
    assert (result.outcome, result.written, result.stop_confirmed) == (RecordingOutcome.RECORDED, True, False)
    assert result.error is not None and result.error.code == "cleanup-unconfirmed"
    assert len(fixture_lines(target)) == 4


@pytest.mark.asyncio
async def test_a_hanging_stop_is_bounded(tmp_path: Path) -> None:
    provider = FaultProvider(TIMELINE, fault=Fault(stop_plan=(HANG,)))
    started = asyncio.get_running_loop().time()
    result = await recorder_for(provider, tmp_path / "ble.jsonl", cleanup_ms=100).run(0.2)
    assert asyncio.get_running_loop().time() - started < 3
    await provider.unplug()
    assert not result.stop_confirmed and result.error is not None
    assert result.error.code == "cleanup-unconfirmed"


class _BrokenDisk(FixtureFile):
    """Accepts the header, then fails like a full disk."""

    def __init__(self, target: Path) -> None:
        super().__init__(target)
        self.lines = 0

    def write(self, line: Mapping[str, Any]) -> None:
        self.lines += 1
        if self.lines > 1:
            raise OSError(28, "No space left on device")
        super().write(line)


@pytest.mark.asyncio
async def test_a_write_failure_ends_the_recording_removes_the_file_and_raises(tmp_path: Path) -> None:
    provider = FaultProvider(TIMELINE)
    scope = recording_scope("ble", 5)
    header = FixtureHeader("ble", "2026-11-30T10:00:00Z", None, {}, "")
    recorder = Recorder(provider, scope, _BrokenDisk(tmp_path / "ble.jsonl"), header, pseudonymiser=None)
    with pytest.raises(OSError):
        await asyncio.wait_for(recorder.run(5), 3)
    assert provider.acknowledged_stops == 1 and files(tmp_path) == []


@pytest.mark.asyncio
async def test_nothing_about_devices_reaches_the_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    refused = FaultProvider(TIMELINE, fault=Fault(stop_plan=(RAISE,)))
    await recorder_for(refused, tmp_path / "a.jsonl").run(0.3)
    await refused.unplug()
    await recorder_for(FaultProvider(TIMELINE, fault=Fault(fail_at_ms=50)), tmp_path / "b.jsonl").run(1)
    text = caplog.text.lower()
    assert ADDRESS.lower() not in text and "strap" not in text and "a.jsonl" not in text
