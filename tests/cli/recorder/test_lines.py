"""Recorder building blocks: pseudonyms, CONTRACT §13 lines that the replay parser accepts, the private
file."""

from __future__ import annotations

import ipaddress
import json
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from connector.cli.recorder import (
    FixtureFile,
    FixtureHeader,
    Pseudonymiser,
    encode_line,
    library_versions,
    observation_line,
    pseudonymised,
    recording_scope,
)
from connector.core.observations import BleObservation, MdnsObservation, Observation, UsbObservation
from connector.core.scope import ScopeFilter, matches_scope, mdns_instance
from providers.replay import parse_fixture
from tests.support.directives import HEART_RATE

PRINTER_TYPE = "_ipp._tcp.local."
BLE = BleObservation(
    address="c4:7c:8d:6a:11:22",
    rssi=-61,
    name="Anna's watch",
    service_uuids=(HEART_RATE,),
    manufacturer_data={0x004C: b"\x02\x15\xaa"},
    service_data={HEART_RATE: b"\x00\xff"},
    tx_power=-8,
    connectable=True,
)
USB = UsbObservation(
    event="add",
    device="/dev/ttyUSB0",
    vid=0x0403,
    pid=0x6001,
    serial_number="A50285BI",
    manufacturer="FTDI",
    product="FT232R USB UART",
    location="1-2",
    interface="UART",
)
MDNS = MdnsObservation(
    event="add",
    service_type=PRINTER_TYPE,
    name="Kowalski Family Printer._ipp._tcp.local.",
    server="kowalski-laser.local.",
    addresses=("192.168.17.23", "fe80::1c2b:3aff:fe4d:5e6f"),
    port=631,
    txt={"ty": "Laser", "adminurl": "http://kowalski-laser.local.:631/", "note": "at 192.168.17.23"},
    ttl=120,
)
HEADER = FixtureHeader("ble", "2026-11-30T10:00:00Z", "hci0", {"bleak": "3.1.0"}, "bench")


def header_for(transport: str) -> FixtureHeader:
    return FixtureHeader(transport, "2026-11-30T10:00:00Z", None, library_versions(), "test")  # type: ignore[arg-type]


def replayed(transport: str, *lines: dict[str, object]) -> list[object]:
    """Observations the replay parser reads back from a header and these lines."""
    text = [encode_line(header_for(transport).line()), *(encode_line(line) for line in lines)]
    fixture = parse_fixture([line.rstrip("\n") for line in text])
    assert fixture.source == "recorded"
    return [observation for _, observation in fixture.timeline]


# ---- pseudonyms ------------------------------------------------------------------------------------------


def test_same_identity_same_pseudonym_and_salts_differ() -> None:
    names, other = Pseudonymiser(), Pseudonymiser()
    assert names.ble_address("c4:7c:8d:6a:11:22") == names.ble_address("C4:7C:8D:6A:11:22")
    assert names.ble_address(BLE.address) != other.ble_address(BLE.address)
    serial = names.serial_number("A50285BI")
    assert serial == names.serial_number("A50285BI") != other.serial_number("A50285BI")
    assert names.ip_address("192.168.17.23") == names.ip_address("192.168.17.23")


def test_a_given_salt_is_deterministic_and_distinct_identities_never_share_a_pseudonym() -> None:
    salt = bytes(range(32))
    assert Pseudonymiser(salt).ble_address(BLE.address) == Pseudonymiser(salt).ble_address(BLE.address)
    names = Pseudonymiser(salt)
    # A form with only 16 values forces collisions: the recorder re-draws until the pseudonym is unused.
    tiny = [names._pseudonym("t", f"id-{i}", lambda digest: digest.hex()[:1]) for i in range(16)]
    assert len(set(tiny)) == 16


def test_ble_pseudonyms_are_locally_administered_unicast_macs_that_filters_accept() -> None:
    names = Pseudonymiser()
    for index in range(200):
        pseudonym = names.ble_address(f"00:11:22:33:44:{index:02X}")
        octets = [int(part, 16) for part in pseudonym.split(":")]
        assert len(octets) == 6 and pseudonym == pseudonym.upper()
        assert octets[0] & 0x02 and not octets[0] & 0x01
    scope = recording_scope("ble", 5)
    renamed = pseudonymised(BLE, names)
    assert isinstance(renamed, BleObservation)
    selector = replace(scope, filters=ScopeFilter(addresses=(renamed.address,)))
    assert matches_scope(selector, renamed)


def test_ble_keeps_its_payloads_and_loses_its_address() -> None:
    renamed = pseudonymised(BLE, Pseudonymiser())
    assert isinstance(renamed, BleObservation)
    assert renamed.address != BLE.address.upper() and renamed.address != BLE.address
    assert (renamed.name, renamed.rssi, renamed.manufacturer_data, renamed.service_data) == (
        BLE.name, BLE.rssi, BLE.manufacturer_data, BLE.service_data
    )


def test_usb_serial_numbers_and_by_id_paths_become_opaque_kernel_names_stay() -> None:
    names = Pseudonymiser()
    renamed = pseudonymised(USB, names)
    assert isinstance(renamed, UsbObservation)
    assert renamed.device == "/dev/ttyUSB0"
    assert renamed.serial_number is not None and "A50285BI" not in renamed.serial_number
    assert (renamed.vid, renamed.pid, renamed.product) == (USB.vid, USB.pid, USB.product)
    assert renamed.location == "1-2"
    by_id = "/dev/serial/by-id/usb-FTDI_FT232R_USB_UART_A50285BI-if00-port0"
    opaque = names.device_path(by_id)
    assert "A50285BI" not in opaque and opaque.startswith("/dev/") and opaque == names.device_path(by_id)
    removal = UsbObservation("remove", "/dev/ttyACM3")
    assert pseudonymised(removal, names) == removal


def test_mdns_keeps_the_service_type_suffix_and_pseudonymises_instance_host_and_addresses() -> None:
    names = Pseudonymiser()
    renamed = pseudonymised(MDNS, names)
    assert isinstance(renamed, MdnsObservation)
    assert renamed.name.endswith("._ipp._tcp.local.")
    label = mdns_instance(renamed.name, PRINTER_TYPE)
    assert label.startswith("device-") and "Kowalski" not in label
    assert renamed.server is not None
    assert renamed.server.startswith("host-") and renamed.server.endswith(".local.")
    v4, v6 = (ipaddress.ip_address(a) for a in renamed.addresses)
    assert v4 in ipaddress.ip_network("198.18.0.0/15") and v6 in ipaddress.ip_network("2001:db8::/32")
    assert (renamed.port, renamed.ttl, renamed.txt["ty"]) == (631, 120, "Laser")
    # TXT values lose the record's own identities, with the same pseudonyms as the record.
    assert renamed.txt["adminurl"] == f"http://{renamed.server}:631/"
    assert renamed.txt["note"] == f"at {renamed.addresses[0]}"
    # The same device under another type keeps its instance pseudonym.
    http = MdnsObservation("add", "_http._tcp.local.", "kowalski family printer._http._tcp.local.")
    renamed_http = pseudonymised(http, names)
    assert isinstance(renamed_http, MdnsObservation)
    assert mdns_instance(renamed_http.name, "_http._tcp.local.") == label
    assert "kowalski" not in json.dumps(observation_line(renamed, 0)).lower()


# ---- lines -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("observation", [BLE, USB, MDNS], ids=["ble", "usb-serial", "mdns"])
def test_lines_replay_to_the_same_observation(observation: Observation) -> None:
    line = observation_line(observation, 1234)
    assert line["t_ms"] == 1234
    assert replayed(observation.transport, line) == [observation]


def test_absent_fields_are_omitted_and_a_minimal_line_replays() -> None:
    bare = BleObservation(address="02:00:00:00:00:01", rssi=-90)
    assert observation_line(bare, 0) == {"t_ms": 0, "address": "02:00:00:00:00:01", "rssi": -90}
    removal = UsbObservation("remove", "/dev/ttyUSB0")
    assert observation_line(removal, 5) == {"t_ms": 5, "event": "remove", "device": "/dev/ttyUSB0"}
    assert replayed("usb-serial", observation_line(removal, 5)) == [removal]


def test_header_line_is_honest_and_complete() -> None:
    line = HEADER.line()
    assert list(line) == ["fixture", "transport", "source", "recorded_at", "adapter", "versions", "notes"]
    assert line["fixture"] == "sensorium-hw-fixture.v1" and line["source"] == "recorded"
    versions = library_versions()
    assert set(versions) == {"bleak", "zeroconf", "pyserial", "python", "sensorium-os-connector"}
    assert all(isinstance(value, str) and value for value in versions.values())


def test_text_a_utf8_file_cannot_hold_is_escaped_and_read_back_exactly() -> None:
    odd = BleObservation(address="02:00:00:00:00:01", rssi=-50, name="caf\u00e9 \udcff")
    text = encode_line(observation_line(odd, 0))
    text.encode("utf-8")
    assert replayed("ble", json.loads(text)) == [odd]
    assert "café" in encode_line(observation_line(BleObservation("02:00:00:00:00:02", -50, "café"), 0))


def test_recording_scope_is_unfiltered_except_for_mdns_types() -> None:
    ble = recording_scope("ble", 10, adapter="hci1")
    assert ble.filters == ScopeFilter() and ble.exclusions is None and ble.adapter == "hci1"
    assert recording_scope("usb-serial", 10, adapter="hci1").adapter is None
    mdns = recording_scope("mdns", 10, service_types=["_http._tcp", "_HTTP._tcp.local."])
    assert mdns.filters == ScopeFilter(service_types=("_http._tcp.local.",))


# ---- the file --------------------------------------------------------------------------------------------


def test_fixture_file_is_private_even_under_a_permissive_umask(tmp_path: Path) -> None:
    target = tmp_path / "session.jsonl"
    target.write_text("old, world-readable\n")
    target.chmod(0o644)
    previous = os.umask(0)
    try:
        output = FixtureFile(target)
        output.open()
    finally:
        os.umask(previous)
    assert stat.S_IMODE(output.partial_path.stat().st_mode) == 0o600
    output.write(HEADER.line())
    assert target.read_text() == "old, world-readable\n"  # nothing replaced before the commit
    output.commit()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert json.loads(target.read_text())["source"] == "recorded"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["session.jsonl"]


def test_discard_leaves_nothing_and_is_idempotent(tmp_path: Path) -> None:
    output = FixtureFile(tmp_path / "session.jsonl")
    output.open()
    output.write(HEADER.line())
    output.discard()
    output.discard()
    assert list(tmp_path.iterdir()) == []


def test_a_partial_file_never_follows_a_planted_link(tmp_path: Path) -> None:
    output = FixtureFile(tmp_path / "session.jsonl")
    victim = tmp_path / "victim"
    victim.write_text("keep")
    output.partial_path.symlink_to(victim)
    with pytest.raises(OSError):
        output.open()
    assert victim.read_text() == "keep"
