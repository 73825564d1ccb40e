"""Recording from the real USB/serial provider (its enumeration worker over a scripted port list)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest

from connector.cli.recorder import (
    FixtureHeader,
    Pseudonymiser,
    Recorder,
    RecordingOutcome,
    library_versions,
    recording_scope,
)
from connector.core.scope import DiscoveryScope, ScopeFilter
from connector.timer import VirtualTimer
from providers.replay import ReplayProvider
from providers.serial import PortInfo, SerialProvider
from tests.cli.recorder.support import TableSink, WatchedFixture, content, fixture_lines
from tests.support.waiting import wait_until

FTDI_SERIAL = "A50285BI"
ARDUINO_SERIAL = "85735313"
FTDI_SCOPE = DiscoveryScope(
    "usb-serial", 10, 64, 65536, ScopeFilter(vid_pid=((0x0403, 0x6001),)), cleanup_timeout_ms=2000
)


@dataclass
class Port:
    """A stand-in for pyserial's ListPortInfo."""

    device: str
    vid: int | None = None
    pid: int | None = None
    serial_number: str | None = None
    manufacturer: str | None = None
    product: str | None = None
    location: str | None = None
    interface: str | None = None


CONSOLE = Port("/dev/ttyS0")
FTDI = Port("/dev/ttyUSB0", 0x0403, 0x6001, FTDI_SERIAL, "FTDI", "FT232R USB UART", "1-2")
ARDUINO = Port("/dev/ttyACM0", 0x2341, 0x0043, ARDUINO_SERIAL, "Arduino (www.arduino.cc)", "Uno", "1-3")


class Bench:
    """The ports a pass sees; the test plugs and unplugs."""

    def __init__(self) -> None:
        self.ports: list[PortInfo] = [CONSOLE, FTDI]

    def enumerate(self) -> list[PortInfo]:
        return list(self.ports)


class _Started:
    def __init__(self) -> None:
        self.event = asyncio.Event()

    def started(self, value: None = None) -> None:
        self.event.set()


async def replay(target: Path, scope: DiscoveryScope) -> TableSink:
    sink = TableSink(scope)
    timer = VirtualTimer()
    session = await ReplayProvider(target, speed=4.0, timer=timer).start(scope, sink)
    await timer.run_until(lambda: session.finished)
    await session.stop()
    return sink


@pytest.mark.asyncio
async def test_usb_recording_pseudonymises_serials_and_replays_to_the_live_candidates(tmp_path: Path) -> None:
    bench = Bench()
    provider = SerialProvider(0.05, enumerate_ports=bench.enumerate)
    live = TableSink(FTDI_SCOPE)
    live_session = await provider.start(FTDI_SCOPE, live)
    target = tmp_path / "usb.jsonl"
    header = FixtureHeader("usb-serial", "2026-11-30T10:00:00Z", None, library_versions(), "scripted ports")
    fixture = WatchedFixture(target)
    recorder = Recorder(provider, recording_scope("usb-serial", 30), fixture, header,
                        pseudonymiser=Pseudonymiser())
    status = _Started()
    task = asyncio.ensure_future(recorder.run(30, task_status=status))
    try:
        await asyncio.wait_for(status.event.wait(), 5)
        await wait_until(lambda: fixture.holds(device=FTDI.device) and bool(live.observations))
        bench.ports.append(ARDUINO)
        await wait_until(lambda: fixture.holds(device=ARDUINO.device, event="add"))
        bench.ports.remove(ARDUINO)
        await wait_until(lambda: fixture.holds(device=ARDUINO.device, event="remove"))
        recorder.finish()
        result = await asyncio.wait_for(task, 5)
    finally:
        await live_session.stop()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert result.outcome is RecordingOutcome.RECORDED and result.stop_confirmed

    text = target.read_text()
    assert FTDI_SERIAL not in text and ARDUINO_SERIAL not in text
    lines = fixture_lines(target)[1:]
    assert "/dev/ttyS0" not in text  # no USB identity: never leaves the provider
    serials = {line["device"]: line["serial_number"] for line in lines}
    assert set(serials) == {"/dev/ttyUSB0", "/dev/ttyACM0"} and len(set(serials.values())) == 2
    assert all(serial.startswith("psn-") for serial in serials.values())
    assert [line["event"] for line in lines if line["device"] == "/dev/ttyACM0"][-1] == "remove"
    replayed = await replay(target, FTDI_SCOPE)
    assert content(replayed.candidates()) == content(live.candidates())
    assert [c["label"] for c in replayed.candidates()] == ["FT232R USB UART"]
    everything = await replay(target, recording_scope("usb-serial", 10))
    assert [c["label"] for c in everything.candidates()] == ["FT232R USB UART"]  # the Arduino left again
