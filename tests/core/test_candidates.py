"""Candidate content (CONTRACT §6.5): label rules, bounds, order, and never an address."""

from __future__ import annotations

import ipaddress
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from connector.contract.canonical import canonical_bytes
from connector.contract.validate import validate
from connector.core.candidates import (
    MAX_LABEL_CHARS,
    candidate_content,
    candidate_size,
    format_ms,
    format_second,
    merged_size,
    sanitise_text,
)
from connector.core.observations import BleObservation, MdnsObservation, Observation, UsbObservation
from connector.core.snapshot import CandidateTable
from tests.core.builders import BATTERY_UUID, HR_UUID, T0, ble, mdns, profile, ref_factory, scope_of, usb


def test_ble_content() -> None:
    content = candidate_content(
        ble(
            name="Polar H10 1234",
            rssi=-61,
            service_uuids=(BATTERY_UUID, HR_UUID, "180A", "not-a-uuid"),
            manufacturer_data={107: b"\x01", 6: b"\x02"},
            service_data={HR_UUID: b"\x00"},
            tx_power=4,
            connectable=True,
        )
    )
    assert content == {
        "label": "Polar H10 1234",
        "signal": {"rssi_dbm": -61},
        "ble": {
            "service_uuids": ["0000180a-0000-1000-8000-00805f9b34fb", HR_UUID, BATTERY_UUID],
            "manufacturer_ids": [6, 107],
            "connectable": True,
            "tx_power": 4,
        },
    }
    assert "signal" not in candidate_content(ble(), include_signal=False)


def test_ble_without_name_has_no_label() -> None:
    assert "label" not in candidate_content(ble(name=None))
    assert "label" not in candidate_content(ble(name=""))
    assert "label" not in candidate_content(ble(name="\x00\x01 "))


def test_usb_label_is_product_else_manufacturer() -> None:
    assert candidate_content(
        usb(
            vid=0x0403,
            pid=0x6001,
            manufacturer="FTDI",
            product="FT232R USB UART",
            serial_number="FTFAKE01",
            location="1-1.2",
        )
    ) == {
        "label": "FT232R USB UART",
        "usb": {"vid": 0x0403, "pid": 0x6001, "manufacturer": "FTDI", "product": "FT232R USB UART"},
    }
    assert candidate_content(usb(manufacturer="Silicon Labs"))["label"] == "Silicon Labs"
    assert candidate_content(usb(manufacturer="Silicon Labs", product="\x07"))["label"] == "Silicon Labs"
    assert candidate_content(usb(device="/dev/ttyS0")) == {}


def test_mdns_label_is_the_instance_name() -> None:
    content = candidate_content(
        mdns(
            "Lab printer._ipp._tcp.local.",
            service_type="_IPP._tcp",
            server="printer.local.",
            addresses=("192.0.2.7",),
            port=631,
            txt={"note": "x"},
            ttl=120,
        )
    )
    assert content == {
        "label": "Lab printer",
        "mdns": {"service_type": "_ipp._tcp.local.", "instance": "Lab printer"},
    }


def test_strings_and_lists_are_bounded_and_sorted() -> None:
    long_name = "N" * 300
    content = candidate_content(
        ble(
            name=long_name,
            service_uuids=tuple(f"0000{n:04x}-0000-1000-8000-00805f9b34fb" for n in range(100, 0, -1)),
            manufacturer_data={n: b"" for n in range(200, 0, -1)},
        )
    )
    assert len(content["label"]) == MAX_LABEL_CHARS
    assert content["ble"]["service_uuids"] == sorted(content["ble"]["service_uuids"])
    assert len(content["ble"]["service_uuids"]) == 64
    assert content["ble"]["manufacturer_ids"] == list(range(1, 65))
    usb_content = candidate_content(usb(manufacturer="M" * 300, product="P" * 300))
    assert len(usb_content["usb"]["manufacturer"]) == 64
    assert len(usb_content["usb"]["product"]) == 64


def test_sanitising_removes_controls_surrogates_and_bidi_overrides() -> None:
    assert sanitise_text("a\x00b\x1fc\x7fd\x85e") == "abcde"
    assert sanitise_text("\u202eevil\u202c name\ud800") == "evil name"
    assert sanitise_text("  padded  ") == "padded"
    assert sanitise_text("\x00") is None
    assert sanitise_text(None) is None
    assert sanitise_text('quote " and \\ stay') == 'quote " and \\ stay'


def test_out_of_range_values_are_dropped() -> None:
    content = candidate_content(ble(tx_power=500, manufacturer_data={70000: b"", -1: b"", 5: b""}))
    assert "tx_power" not in content["ble"]
    assert content["ble"]["manufacturer_ids"] == [5]


def test_time_formats() -> None:
    assert format_second(T0 // 1000) == "2026-11-30T12:00:00Z"
    assert format_ms(T0 + 1000) == "2026-11-30T12:00:01Z"
    assert format_ms(T0 + 1250) == "2026-11-30T12:00:01.250Z"
    assert format_ms(T0 + 7) == "2026-11-30T12:00:00.007Z"


def test_merged_size() -> None:
    first = {"a": 1, "b": "x"}
    second = {"c": [1, 2], "d": {"e": True}}
    assert merged_size(candidate_size(first), second) == len(canonical_bytes({**first, **second}))
    assert merged_size(candidate_size(first), {}) == candidate_size(first)


# -- properties: no address ever; sizes are the RFC 8785 sizes -------------------------------------------

MAC = st.tuples(*[st.integers(0, 255)] * 6).map(lambda o: ":".join(f"{b:02X}" for b in o))
IPV4 = st.ip_addresses(v=4).map(str)
IPV6 = st.ip_addresses(v=6).map(str)
SERIAL = st.from_regex(r"SN[A-Z0-9]{10}", fullmatch=True)
PATH = st.from_regex(r"/dev/tty(USB|ACM)[0-9]{1,2}", fullmatch=True)
TEXT = st.text(max_size=80)


def _ble(address: str) -> st.SearchStrategy[BleObservation]:
    return st.builds(
        BleObservation,
        address=st.just(address),
        rssi=st.integers(-200, 200),
        name=st.none() | TEXT,
        service_uuids=st.lists(st.uuids().map(str) | TEXT, max_size=5).map(tuple),
        manufacturer_data=st.dictionaries(st.integers(-5, 70000), st.binary(max_size=8), max_size=4),
        service_data=st.dictionaries(TEXT, st.binary(max_size=8), max_size=2),
        tx_power=st.none() | st.integers(-300, 300),
        connectable=st.none() | st.booleans(),
    )


def _usb(device: str, serial: str) -> st.SearchStrategy[UsbObservation]:
    return st.builds(
        UsbObservation,
        event=st.just("add"),
        device=st.just(device),
        vid=st.none() | st.integers(0, 0xFFFF),
        pid=st.none() | st.integers(0, 0xFFFF),
        serial_number=st.just(serial),
        manufacturer=st.none() | TEXT,
        product=st.none() | TEXT,
        location=st.just(f"{device}-location"),
        interface=st.none() | TEXT,
    )


def _mdns(ip4: str, ip6: str, port: int) -> st.SearchStrategy[MdnsObservation]:
    return st.builds(
        MdnsObservation,
        event=st.sampled_from(["add", "update"]),
        service_type=st.sampled_from(["_ipp._tcp.local.", "_http._tcp", "_hap._tcp.local."]),
        name=TEXT.map(lambda n: f"{n}._ipp._tcp.local."),
        server=st.just(f"host-{port}.local."),
        addresses=st.just((ip4, ip6)),
        port=st.just(port),
        txt=st.dictionaries(TEXT, TEXT, max_size=2),
        ttl=st.none() | st.integers(1, 4500),
    )


@st.composite
def private_observations(draw: st.DrawFn) -> tuple[Observation, list[str]]:
    """An observation and the identities it carries that a candidate must never show."""
    address, serial, device = draw(MAC), draw(SERIAL), draw(PATH)
    ip4, ip6, port = draw(IPV4), draw(IPV6), draw(st.integers(1024, 65535))
    kind = draw(st.sampled_from(["ble", "usb", "mdns"]))
    if kind == "ble":
        return draw(_ble(address)), [address, address.lower(), address.replace(":", "")]
    if kind == "usb":
        return draw(_usb(device, serial)), [device, serial, f"{device}-location"]
    compressed = ipaddress.ip_address(ip6).compressed
    return draw(_mdns(ip4, ip6, port)), [ip4, ip6, compressed, f"host-{port}.local", f":{port}"]


def _table_for(observation: Observation) -> CandidateTable:
    raws: dict[str, dict[str, Any]] = {
        "ble": {"transport": "ble"},
        "usb-serial": {"transport": "usb-serial"},
        "mdns": {"transport": "mdns", "filters": {"service_types": ["_ipp._tcp", "_http._tcp", "_hap._tcp"]}},
    }
    raw = raws[observation.transport]
    prof = profile(allow_unfiltered=True)
    return CandidateTable(scope_of(raw, prof), prof, generation="gen-1", new_ref=ref_factory())


@settings(max_examples=400, deadline=None)
@given(private_observations())
def test_candidate_bytes_never_hold_an_address(case: tuple[Observation, list[str]]) -> None:
    observation, identities = case
    table = _table_for(observation)
    table.ingest(observation, T0)
    revision = table.cut(T0)
    assert revision is not None
    encoded = canonical_bytes(revision.snapshot()).decode()
    for identity in identities:
        # Short fragments (e.g. `:1024`) could occur by chance in generated names; identities cannot.
        if len(identity) >= 6:
            assert identity not in encoded
    candidate = revision.candidates[0]
    assert validate("sensorium-device-discovery-candidate.v1", candidate, via="schema") == []
    assert set(candidate) <= {
        "schema",
        "candidate/ref",
        "transport",
        "generation",
        "first_seen_at",
        "last_seen_at",
        "expires_at",
        "label",
        "signal",
        "ble",
        "usb",
        "mdns",
    }
    assert not _keys(candidate) & {
        "address",
        "addresses",
        "device",
        "serial_number",
        "port",
        "server",
        "txt",
        "location",
        "manufacturer_data",
        "service_data",
    }


def _keys(value: object) -> set[str]:
    """Every key of a JSON value, at any depth."""
    if isinstance(value, dict):
        return set(value) | {key for item in value.values() for key in _keys(item)}
    if isinstance(value, list):
        return {key for item in value for key in _keys(item)}
    return set()


@settings(max_examples=300, deadline=None)
@given(private_observations())
def test_tracked_snapshot_size_is_the_canonical_size(case: tuple[Observation, list[str]]) -> None:
    observation, _ = case
    table = _table_for(observation)
    table.ingest(observation, T0)
    revision = table.cut(T0)
    assert revision is not None
    exact = len(canonical_bytes(revision.snapshot()))
    assert revision.snapshot_bytes == exact == table.snapshot_bytes()
    # The fast encoder used for sizes agrees with RFC 8785 on every sanitised candidate.
    assert candidate_size(revision.candidates[0]) == len(canonical_bytes(revision.candidates[0]))
    assert json.loads(canonical_bytes(revision.snapshot())) == revision.snapshot()
