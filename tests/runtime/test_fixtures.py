"""The shipped hw-fixtures: valid, honest, synthetic identities, and exactly what the generator writes."""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

from connector.core.observations import BleObservation, MdnsObservation, UsbObservation
from providers.replay import load_fixture
from tests.support.paths import REPO

SCRIPT = REPO / "scripts" / "synth_fixtures.py"
DOC_NETS = [ipaddress.ip_network("192.0.2.0/24"), ipaddress.ip_network("198.51.100.0/24")]
EDDYSTONE = "0000feaa-0000-1000-8000-00805f9b34fb"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("synth_fixtures", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules while the class body runs.
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def fixture_files(fixtures_dir: Path) -> list[Path]:
    return sorted(fixtures_dir.glob("*.jsonl"))


def test_the_shipped_fixtures_are_what_the_generator_writes(fixtures_dir: Path, tmp_path: Path) -> None:
    written = load_script().write_all(tmp_path)
    assert sorted(p.name for p in written) == [p.name for p in fixture_files(fixtures_dir)]
    for path in written:
        assert path.read_bytes() == (fixtures_dir / path.name).read_bytes(), path.name


def test_at_least_three_valid_files_per_transport_and_small_enough(fixtures_dir: Path) -> None:
    per_transport = Counter(load_fixture(path).transport for path in fixture_files(fixtures_dir))
    assert per_transport["ble"] >= 3 and per_transport["usb-serial"] >= 3 and per_transport["mdns"] >= 3
    assert max(path.stat().st_size for path in fixture_files(fixtures_dir)) < 1_500_000


def test_headers_say_honestly_that_they_are_synthesised(fixtures_dir: Path) -> None:
    for path in fixture_files(fixtures_dir):
        header = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
        assert header["source"] == "synthesised"
        assert "not recorded" in header["notes"].lower()
        assert set(header) == {
            "fixture",
            "transport",
            "source",
            "recorded_at",
            "adapter",
            "versions",
            "notes",
        }


def test_ble_addresses_are_locally_administered_unicast(fixtures_dir: Path) -> None:
    for path in fixture_files(fixtures_dir):
        fixture = load_fixture(path)
        for _, obs in fixture.timeline:
            if isinstance(obs, BleObservation):
                first = int(obs.address.split(":")[0], 16)
                assert first & 0x02 and not first & 0x01, path.name


def test_mdns_addresses_are_documentation_ranges(fixtures_dir: Path) -> None:
    for path in fixture_files(fixtures_dir):
        for _, obs in load_fixture(path).timeline:
            if isinstance(obs, MdnsObservation):
                for address in obs.addresses:
                    assert any(ipaddress.ip_address(address) in net for net in DOC_NETS), path.name


def test_the_crowded_office_has_the_promised_population(fixtures_dir: Path) -> None:
    timeline = load_fixture(fixtures_dir / "ble-office-crowd.jsonl").timeline
    adverts = [obs for _, obs in timeline if isinstance(obs, BleObservation)]
    by_address: dict[str, list[BleObservation]] = {}
    for obs in adverts:
        by_address.setdefault(obs.address, []).append(obs)
    assert len(by_address) >= 200
    assert timeline[-1][0] >= 29_000
    assert sum(1 for seen in by_address.values() if 0x004C in seen[0].manufacturer_data) >= 100
    assert sum(1 for seen in by_address.values() if 0x0006 in seen[0].manufacturer_data) >= 30
    ibeacons = [
        a for a, seen in by_address.items() if seen[0].manufacturer_data.get(0x004C, b"")[:2] == b"\x02\x15"
    ]
    assert len(ibeacons) >= 5
    assert sum(1 for seen in by_address.values() if EDDYSTONE in seen[0].service_data) >= 5
    assert sum(1 for seen in by_address.values() if seen[0].service_data and seen[0].name is None) >= 3
    assert sum(1 for seen in by_address.values() if seen[0].name is None) >= 150
    assert any(len({o.rssi for o in seen}) > 3 for seen in by_address.values()), "RSSI drifts"
    last_seen = {
        a: max(t for t, o in timeline if isinstance(o, BleObservation) and o.address == a)
        for a in list(by_address)[:80]
    }
    assert any(t < 20_000 for t in last_seen.values()), "some devices leave"


def test_usb_fixtures_cover_the_common_chips_and_a_console_without_usb_info(fixtures_dir: Path) -> None:
    seen: set[tuple[int | None, int | None]] = set()
    events: set[str] = set()
    for path in fixture_files(fixtures_dir):
        for _, obs in load_fixture(path).timeline:
            if isinstance(obs, UsbObservation):
                seen.add((obs.vid, obs.pid))
                events.add(obs.event)
                if obs.device == "/dev/ttyS0":
                    assert obs.vid is None and obs.pid is None and obs.serial_number is None
    assert {(0x0403, 0x6001), (0x10C4, 0xEA60), (0x1A86, 0x7523), (0x2341, 0x0043), (None, None)} <= seen
    assert events == {"add", "remove"}


def test_mdns_fixtures_have_adds_updates_removals_and_short_ttls(fixtures_dir: Path) -> None:
    events: set[str] = set()
    types: set[str] = set()
    ttls: list[int] = []
    for path in fixture_files(fixtures_dir):
        for _, obs in load_fixture(path).timeline:
            if isinstance(obs, MdnsObservation):
                events.add(obs.event)
                types.add(obs.service_type)
                if obs.ttl is not None:
                    ttls.append(obs.ttl)
    assert events == {"add", "update", "remove"}
    assert {"_http._tcp.local.", "_ipp._tcp.local.", "_hap._tcp.local.", "_googlecast._tcp.local."} <= types
    assert min(ttls) <= 5


@pytest.mark.parametrize(
    "name", ["ble-office-crowd.jsonl", "usb-serial-lab-rack.jsonl", "mdns-home-network.jsonl"]
)
def test_no_serial_number_or_name_looks_real(fixtures_dir: Path, name: str) -> None:
    for _, obs in load_fixture(fixtures_dir / name).timeline:
        if isinstance(obs, UsbObservation) and obs.serial_number is not None:
            assert obs.serial_number.startswith("SYNTH")
        if isinstance(obs, BleObservation) and obs.name is not None:
            assert obs.name.startswith("SYNTH")
        if isinstance(obs, MdnsObservation):
            assert obs.name.lower().startswith("synth")
