"""The replay backend: fixture parsing and refusals, timing, filtering, quiet end, stop."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from connector.core.observations import BleObservation, MdnsObservation, UsbObservation
from connector.core.scope import ScopeFilter, matches_scope
from connector.errors import ProviderUnavailable
from connector.timer import VirtualTimer
from providers.replay import FixtureError, ReplayProvider, load_fixture, parse_fixture
from tests.runtime.support import RecordingSink, ble_scope, other_tasks
from tests.support.directives import HEART_RATE

HEADER = {
    "fixture": "sensorium-hw-fixture.v1",
    "transport": "ble",
    "source": "synthesised",
    "recorded_at": "2026-11-30T09:00:00Z",
    "adapter": "hci0",
    "versions": {},
    "notes": "test",
}
CANARY = "CANARY-7f3a"


def lines(*observations: dict[str, object], header: dict[str, object] | None = None) -> list[str]:
    return [json.dumps(header or HEADER)] + [json.dumps(o) for o in observations]


def advert(t_ms: int, index: int, **extra: object) -> dict[str, object]:
    line: dict[str, object] = {"t_ms": t_ms, "address": f"02:00:00:00:00:{index:02X}", "rssi": -60}
    line.update(extra)
    return line


# ---- parsing ---------------------------------------------------------------------------------------------


def test_ble_line_becomes_an_observation() -> None:
    fixture = parse_fixture(
        lines(
            advert(
                5,
                1,
                name="hrm",
                service_uuids=[HEART_RATE.upper()],
                manufacturer_data={"76": "0215aa"},
                service_data={"0000FEAA-0000-1000-8000-00805F9B34FB": "00ff"},
                tx_power=-4,
                connectable=True,
            )
        )
    )
    assert fixture.transport == "ble" and fixture.source == "synthesised"
    ((t_ms, obs),) = fixture.timeline
    assert t_ms == 5
    assert obs == BleObservation(
        address="02:00:00:00:00:01",
        rssi=-60,
        name="hrm",
        service_uuids=(HEART_RATE,),
        manufacturer_data={76: bytes.fromhex("0215aa")},
        service_data={"0000feaa-0000-1000-8000-00805f9b34fb": b"\x00\xff"},
        tx_power=-4,
        connectable=True,
    )


def test_usb_and_mdns_lines_become_observations() -> None:
    usb = parse_fixture(
        lines(
            {
                "t_ms": 0,
                "event": "add",
                "device": "/dev/ttyUSB0",
                "vid": 1027,
                "pid": 24577,
                "serial_number": "S1",
                "manufacturer": "FTDI",
                "product": "FT232R",
                "location": "1-1",
                "interface": "x",
            },
            {"t_ms": 10, "event": "remove", "device": "/dev/ttyUSB0"},
            header={**HEADER, "transport": "usb-serial", "adapter": None},
        )
    )
    assert [obs for _, obs in usb.timeline] == [
        UsbObservation("add", "/dev/ttyUSB0", 1027, 24577, "S1", "FTDI", "FT232R", "1-1", "x"),
        UsbObservation("remove", "/dev/ttyUSB0"),
    ]
    mdns = parse_fixture(
        lines(
            {
                "t_ms": 0,
                "event": "add",
                "service_type": "_http._tcp.local.",
                "name": "a._http._tcp.local.",
                "server": "a.local.",
                "addresses": ["192.0.2.1"],
                "port": 80,
                "txt": {"k": "v"},
                "ttl": 3,
            },
            header={**HEADER, "transport": "mdns"},
        )
    )
    assert mdns.timeline[0][1] == MdnsObservation(
        "add", "_http._tcp.local.", "a._http._tcp.local.", "a.local.", ("192.0.2.1",), 80, {"k": "v"}, 3
    )


MALFORMED: list[tuple[str, list[str], str]] = [
    ("empty file", [], "line 1: missing-header"),
    ("header not JSON", [f"{{{CANARY}"], "line 1: invalid-json"),
    ("header not an object", [json.dumps([CANARY])], "line 1: not-an-object"),
    ("unknown format", lines(header={**HEADER, "fixture": CANARY}), "line 1: /fixture: unknown-format"),
    (
        "unknown transport",
        lines(header={**HEADER, "transport": CANARY}),
        "line 1: /transport: unknown-transport",
    ),
    ("unknown source", lines(header={**HEADER, "source": CANARY}), "line 1: /source: unknown-source"),
    ("notes not a string", lines(header={**HEADER, "notes": [CANARY]}), "line 1: /notes: not-a-string"),
    ("line not JSON", [json.dumps(HEADER), CANARY], "line 2: invalid-json"),
    ("missing t_ms", lines({"address": CANARY, "rssi": -1}), "line 2: /t_ms: required"),
    ("negative t_ms", lines(advert(-1, 1)), "line 2: /t_ms: out-of-range"),
    ("time goes back", lines(advert(10, 1), advert(5, 2)), "line 3: /t_ms: not-monotonic"),
    ("missing address", lines({"t_ms": 0, "rssi": -1}), "line 2: /address: required"),
    ("rssi a string", lines(advert(0, 1, rssi=CANARY)), "line 2: /rssi: not-an-integer"),
    ("rssi a bool", lines(advert(0, 1, rssi=True)), "line 2: /rssi: not-an-integer"),
    ("rssi out of range", lines(advert(0, 1, rssi=500)), "line 2: /rssi: out-of-range"),
    ("unknown key", lines(advert(0, 1, **{CANARY: 1})), "line 2: unknown-key"),
    ("misspelt key", lines(advert(0, 1, rssi_dbm=-60)), "line 2: /rssi_dbm: unknown-key"),
    (
        "payload not hex",
        lines(advert(0, 1, manufacturer_data={"76": CANARY})),
        "line 2: /manufacturer_data: not-hex",
    ),
    (
        "company not decimal",
        lines(advert(0, 1, manufacturer_data={"0x4c": "00"})),
        "line 2: /manufacturer_data: not-a-company-id",
    ),
    (
        "uuids not strings",
        lines(advert(0, 1, service_uuids=[1])),
        "line 2: /service_uuids: not-a-string-list",
    ),
    ("null name", lines(advert(0, 1, name=None)), "line 2: /name: null"),
]


@pytest.mark.parametrize(("case", "body", "expected"), MALFORMED, ids=[case for case, _, _ in MALFORMED])
def test_malformed_fixture_is_refused_without_its_content(case: str, body: list[str], expected: str) -> None:
    with pytest.raises(FixtureError) as refused:
        parse_fixture(body)
    message = str(refused.value)
    assert message == f"replay fixture malformed: {expected}"
    assert refused.value.code == "provider-unavailable"
    assert CANARY not in message
    assert refused.value.__cause__ is None or CANARY not in str(refused.value.__cause__)


@pytest.mark.parametrize(
    ("transport", "line", "rule"),
    [
        ("usb-serial", {"t_ms": 0, "event": "plug", "device": "/dev/x"}, "/event: unknown-event"),
        ("usb-serial", {"t_ms": 0, "event": "add", "device": "/dev/x", "vid": 70000}, "/vid: out-of-range"),
        (
            "mdns",
            {"t_ms": 0, "event": "gone", "service_type": "_a._tcp", "name": "n"},
            "/event: unknown-event",
        ),
        (
            "mdns",
            {"t_ms": 0, "event": "add", "service_type": "_a._tcp", "name": "n", "txt": {"k": 1}},
            "/txt: not-a-string-map",
        ),
        (
            "mdns",
            {"t_ms": 0, "event": "add", "service_type": "_a._tcp", "name": "n", "port": -1},
            "/port: out-of-range",
        ),
    ],
)
def test_usb_and_mdns_refusals(transport: str, line: dict[str, object], rule: str) -> None:
    with pytest.raises(FixtureError, match=f"line 2: {rule}$"):
        parse_fixture(lines(line, header={**HEADER, "transport": transport}))


def test_unreadable_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FixtureError, match="unreadable"):
        load_fixture(tmp_path / "missing.jsonl")
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(FixtureError, match="unreadable"):
        load_fixture(binary)


@pytest.mark.parametrize("speed", [0, -1.0, float("nan"), float("inf")])
def test_replay_speed_must_be_positive_and_finite(fixtures_dir: Path, speed: float) -> None:
    with pytest.raises(FixtureError, match="speed"):
        ReplayProvider(fixtures_dir / "ble-heart-rate-lab.jsonl", speed=speed)


# ---- playing ---------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_replay_plays_the_fixture_timing(write_fixture: Callable[..., Path]) -> None:
    path = write_fixture(
        lines(*(advert(t, i, service_uuids=[HEART_RATE]) for i, t in enumerate([0, 200, 400, 1000])))
    )
    timer = VirtualTimer()
    provider = ReplayProvider(path, speed=4.0, timer=timer)
    sink = RecordingSink(timer)
    session = await provider.start(ble_scope(), sink)
    await timer.advance(450)
    await session.stop()
    assert [at for at, _ in sink.observed] == [0.0, 0.05, 0.1, 0.25]


@pytest.mark.asyncio
async def test_replay_filters_through_the_scope_and_stays_quiet_after_the_last_line(
    fixtures_dir: Path,
) -> None:
    path = fixtures_dir / "ble-heart-rate-lab.jsonl"
    fixture = load_fixture(path)
    scope = ble_scope()
    expected = [obs for _, obs in fixture.timeline if matches_scope(scope, obs)]
    timer = VirtualTimer()
    provider = ReplayProvider(path, speed=100.0, timer=timer)
    sink = RecordingSink()
    session = await provider.start(scope, sink)
    await timer.run_until(lambda: session.finished, limit_ms=3_000)
    # Finished means the player ended after the last line: no loop, and nothing more arrives.
    assert timer.next_due_ms() is None
    await timer.advance(10_000)
    assert [obs for _, obs in sink.observed] == expected
    assert 0 < len(expected) < len(fixture.timeline)
    assert sink.failures == []
    await session.stop()
    await session.stop()
    assert other_tasks() == set()


@pytest.mark.asyncio
async def test_each_session_plays_from_the_first_line(fixtures_dir: Path) -> None:
    timer = VirtualTimer()
    provider = ReplayProvider(fixtures_dir / "usb-serial-clone-reset.jsonl", speed=50.0, timer=timer)
    scope = ble_scope(transport="usb-serial", filters=ScopeFilter(vid_pid=((0x1A86, 0x7523),)))
    first, second = RecordingSink(timer), RecordingSink(timer)
    one = await provider.start(scope, first)
    await timer.advance(100)
    two = await provider.start(scope, second)
    await timer.advance(300)
    await one.stop()
    await two.stop()
    assert provider.capabilities.concurrent_sessions
    assert [o for _, o in first.observed] == [o for _, o in second.observed]
    assert first.observed and all(o.device == "/dev/ttyUSB0" for _, o in first.observed)  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_stop_cancels_the_player_and_is_idempotent(fixtures_dir: Path) -> None:
    timer = VirtualTimer()
    provider = ReplayProvider(fixtures_dir / "ble-office-crowd.jsonl", speed=1.0, timer=timer)
    sink = RecordingSink()
    scope = ble_scope(filters=ScopeFilter(manufacturer_ids=(0x004C,)))
    session = await provider.start(scope, sink)
    await timer.advance(200)
    await session.stop()
    seen = len(sink.observed)
    await timer.advance(30_000)
    assert len(sink.observed) == seen
    assert session.finished
    await session.stop()
    assert other_tasks() == set()


@pytest.mark.asyncio
async def test_a_fixture_of_another_transport_refuses_to_start(fixtures_dir: Path) -> None:
    provider = ReplayProvider(fixtures_dir / "mdns-home-network.jsonl")
    with pytest.raises(ProviderUnavailable):
        await provider.start(ble_scope(), RecordingSink())
