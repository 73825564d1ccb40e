"""Recording from the real BLE provider (bleak on emulated BlueZ) and replaying the file: same candidates."""

from __future__ import annotations

import asyncio
import re
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
    RecordingResult,
    library_versions,
    recording_scope,
)
from connector.core.admission import SessionSpec
from connector.core.clock import wall_clock_ms
from connector.core.lifecycle import Status
from connector.core.observations import BleObservation, Observation
from connector.core.scope import DiscoveryScope, ScopeFilter
from connector.runtime.manager import DiscoveryManager, ScanAdmission
from providers.base import Provider
from providers.ble import BleProvider
from providers.replay import ReplayProvider, ReplaySession
from tests.cli.recorder.support import ENV_SENSING, PROFILE, TableSink, content, fixture_lines
from tests.providers.bluez_mock import BluezController, bluez, every_advert
from tests.runtime.sessions import until_terminal
from tests.support.directives import HEART_RATE
from tests.support.waiting import wait_until

__all__ = ["bluez", "every_advert"]  # the fixtures, imported above

STRAP_A = "AA:BB:CC:00:00:01"
STRAP_B = "AA:BB:CC:00:00:02"
THERMO = "AA:BB:CC:00:00:03"
POLAR, NORDIC, GARMIN = 0x006B, 0x0059, 0x0087
HEART_SCOPE = DiscoveryScope(
    transport="ble",
    window_seconds=10,
    max_candidates=64,
    max_snapshot_bytes=65536,
    filters=ScopeFilter(service_uuids=(HEART_RATE,)),
    cleanup_timeout_ms=1000,
)


def drive(controller: BluezController) -> None:
    """The same bench story for every session: two straps (one unnamed at first) and a thermometer."""
    controller.add_device(
        STRAP_A, name="Polar H10 A", rssi=-60, service_uuids=[HEART_RATE],
        manufacturer_data={POLAR: b"\x01\x02"}, tx_power=-4,
    )
    controller.add_device(STRAP_B, rssi=-75, service_uuids=[HEART_RATE], service_data={HEART_RATE: b"\x07"})
    controller.add_device(THERMO, name="Thermo", rssi=-50, service_uuids=[ENV_SENSING],
                          manufacturer_data={NORDIC: b"\x10"})
    controller.update(STRAP_A, rssi=-48)
    controller.update(STRAP_B, name="Garmin HRM", manufacturer_data={GARMIN: b"\x05"})
    controller.update(THERMO, rssi=-52)
    controller.update(STRAP_A, rssi=-51)


def forget_devices(controller: BluezController) -> None:
    """Between sessions the devices vanish, so that the next session sees them arrive again."""
    for address in (STRAP_A, STRAP_B, THERMO):
        controller.remove(address)


def payload(observation: Observation) -> tuple[object, ...]:
    """An advert without its address."""
    assert isinstance(observation, BleObservation)
    o = observation
    return (o.name, o.rssi, o.service_uuids, dict(o.manufacturer_data), dict(o.service_data), o.tx_power,
            o.connectable)


async def live_session(controller: BluezController) -> TableSink:
    """A heart-rate scan with the real provider while the story plays."""
    sink = TableSink(HEART_SCOPE)
    session = await BleProvider(every_report=True).start(HEART_SCOPE, sink)
    try:
        drive(controller)
        await wait_until(lambda: any(o.rssi == -51 for o in sink.observations))  # type: ignore[union-attr]
    finally:
        await session.stop()
    return sink


class _Started:
    """A task status that lets the test drive devices once the provider runs."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def started(self, value: None = None) -> None:
        self.event.set()


STORY_REPORTS = 7  # the adverts `drive()` makes the emulated bluetoothd report with DuplicateData set


async def record(controller: BluezController, target: Path, *, keep: bool = False) -> RecordingResult:
    """`fixtures record --transport ble` as a library call: play the story, end once all of it was written."""
    header = FixtureHeader("ble", "2026-11-30T10:00:00Z", "hci0", library_versions(), "emulated BlueZ")
    recorder = Recorder(
        BleProvider(adapter="hci0", every_report=True),
        recording_scope("ble", 2, adapter="hci0"),
        FixtureFile(target),
        header,
        pseudonymiser=None if keep else Pseudonymiser(),
    )
    status = _Started()
    task = asyncio.ensure_future(recorder.run(120, task_status=status))
    await asyncio.wait_for(status.event.wait(), 30)
    drive(controller)
    # Ends on what was written, not on a window that a loaded machine could outrun.
    await wait_until(lambda: recorder.observations >= STORY_REPORTS or task.done(), timeout=60)
    recorder.finish()
    return await asyncio.wait_for(task, 30)


async def replay(target: Path, scope: DiscoveryScope) -> TableSink:
    """Play the whole file (sped up) through the replay provider into a fresh candidate table."""
    sink = TableSink(scope)
    session = await ReplayProvider(target, speed=4.0).start(scope, sink)
    assert isinstance(session, ReplaySession)
    try:
        await wait_until(lambda: session.finished)
    finally:
        await session.stop()
    return sink


@pytest.mark.asyncio
@pytest.mark.usefixtures("every_advert")  # the story repeats adverts within one scan
async def test_a_recording_replays_to_the_candidates_the_live_session_produced(
    bluez: BluezController, tmp_path: Path
) -> None:
    live = await live_session(bluez)
    forget_devices(bluez)
    target = tmp_path / "bench.jsonl"
    result = await record(bluez, target)
    assert result.outcome is RecordingOutcome.RECORDED and result.stop_confirmed
    assert not bluez.discovering()

    replayed = await replay(target, HEART_SCOPE)
    live_candidates, replayed_candidates = live.candidates(), replayed.candidates()
    assert len(live_candidates) == 2
    assert content(replayed_candidates) == content(live_candidates)
    labels = sorted(c.get("label", "") for c in replayed_candidates)
    assert labels == ["Garmin HRM", "Polar H10 A"]
    assert {c["signal"]["rssi_dbm"] for c in replayed_candidates} == {-51, -75}
    assert sorted(sorted(c["ble"]["manufacturer_ids"]) for c in replayed_candidates) == [[POLAR], [GARMIN]]
    # Advert by advert, the in-scope part of the recording is what the live session saw.
    assert [payload(o) for o in replayed.observations] == [payload(o) for o in live.observations]


@pytest.mark.asyncio
@pytest.mark.usefixtures("every_advert")  # the story repeats adverts within one scan
async def test_the_recording_is_unfiltered_and_pseudonymised(bluez: BluezController, tmp_path: Path) -> None:
    target = tmp_path / "bench.jsonl"
    result = await record(bluez, target)
    header, *lines = fixture_lines(target)
    assert result.observations == len(lines) == STORY_REPORTS
    assert header == {
        "fixture": "sensorium-hw-fixture.v1", "transport": "ble", "source": "recorded",
        "recorded_at": "2026-11-30T10:00:00Z", "adapter": "hci0", "versions": library_versions(),
        "notes": "emulated BlueZ",
    }
    names = [line.get("name") for line in lines]
    assert "Thermo" in names  # out of any heart-rate scope, yet recorded
    by_name = {line["name"]: line["address"] for line in lines if "name" in line}
    assert len(set(by_name.values())) == 3  # three devices, three pseudonyms, each stable
    assert {line["address"] for line in lines} == set(by_name.values())
    text = target.read_text()
    for address in (STRAP_A, STRAP_B, THERMO):
        for form in (address, address.lower(), address.replace(":", "_"), address.replace(":", "-")):
            assert form not in text
    for pseudonym in by_name.values():
        assert re.fullmatch(r"[0-9A-F]{2}(:[0-9A-F]{2}){5}", pseudonym)
        assert int(pseudonym[:2], 16) & 0x03 == 0x02  # locally administered, unicast
    # A scan for the thermometer's pseudonymised address finds it on replay.
    selector = DiscoveryScope("ble", 5, 64, 65536, ScopeFilter(addresses=(by_name["Thermo"],)))
    assert [c.get("label") for c in (await replay(target, selector)).candidates()] == ["Thermo"]


@pytest.mark.asyncio
@pytest.mark.usefixtures("every_advert")  # the story repeats adverts within one scan
async def test_pseudonyms_differ_across_recordings_and_kept_identities_are_real(
    bluez: BluezController, tmp_path: Path
) -> None:
    first, second, kept = tmp_path / "first.jsonl", tmp_path / "second.jsonl", tmp_path / "kept.jsonl"
    await record(bluez, first)
    forget_devices(bluez)
    await record(bluez, second)
    forget_devices(bluez)
    await record(bluez, kept, keep=True)
    addresses = [{line["address"] for line in fixture_lines(path)[1:]} for path in (first, second, kept)]
    assert len(addresses[0]) == len(addresses[1]) == 3 and not addresses[0] & addresses[1]
    assert addresses[2] == {STRAP_A, STRAP_B, THERMO}


@pytest.mark.asyncio
async def test_no_adapter_fails_the_recording_and_leaves_nothing(
    bluez: BluezController, tmp_path: Path
) -> None:
    bluez.remove_adapter()
    header = FixtureHeader("ble", "2026-11-30T10:00:00Z", None, {}, "")
    target = FixtureFile(tmp_path / "x.jsonl")
    provider = BleProvider(every_report=True)
    recorder = Recorder(provider, recording_scope("ble", 1), target, header, pseudonymiser=Pseudonymiser())
    result = await recorder.run(1)
    assert result.outcome is RecordingOutcome.FAILED and result.error is not None
    assert result.error.code == "provider-unavailable"
    assert list(tmp_path.iterdir()) == []


async def scan_through_runtime(
    provider: Provider, *, drive_with: BluezController | None = None
) -> dict[str, Any]:
    """One heart-rate scan through `DiscoveryManager`, as `scan` and `serve` run it; its terminal status."""
    scope = replace(HEART_SCOPE, window_seconds=2)
    async with DiscoveryManager() as manager:
        now_ms = wall_clock_ms()
        spec = SessionSpec(
            operation_id="deferred:sensorium.directive.invoke:" + "A" * 26, owner="bench",
            action_id="device.discovery.scan", scope=scope, profile=PROFILE, created_at_ms=now_ms,
            window_end_ms=now_ms + 2000, cut_by_deadline=False, timeout_at_ms=None, expires_at_ms=None,
            causal_context=None, retry_after_seconds=1,
        )
        session = await manager.admit(ScanAdmission(spec, provider))
        await wait_until(lambda: session.status is Status.RUNNING)
        if drive_with is not None:
            drive(drive_with)
        return await until_terminal(manager, spec.operation_id)


@pytest.mark.asyncio
@pytest.mark.usefixtures("every_advert")  # the story repeats adverts within one scan
async def test_through_the_runtime_the_replayed_scan_ends_with_the_live_scan_candidates(
    bluez: BluezController, tmp_path: Path
) -> None:
    live = await scan_through_runtime(BleProvider(), drive_with=bluez)
    forget_devices(bluez)
    target = tmp_path / "bench.jsonl"
    await record(bluez, target)
    replayed = await scan_through_runtime(ReplayProvider(target, speed=2.0))
    for status in (live, replayed):
        assert status["status"] == "completed" and status["result"]["reason"] == "window-complete"
    assert len(live["result"]["candidates"]) == 2
    assert content(replayed["result"]["candidates"]) == content(live["result"]["candidates"])
