"""Scope matching (CONTRACT §6.1, 6.3): AND across keys, any within a list, exclusions on their own."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from connector.core.observations import BleObservation, MdnsObservation, Observation, UsbObservation
from connector.core.scope import (
    DiscoveryScope,
    ScopeFilter,
    backend_filter_hint,
    matches_scope,
    mdns_instance,
    normalise_service_type,
    redacted_scope,
    scope_matcher,
)
from tests.core.builders import BATTERY_UUID, HR_UUID, ble, mdns, scope_of, usb


def test_ble_filters_combine_with_and_lists_with_any() -> None:
    scope = scope_of(
        {
            "transport": "ble",
            "filters": {
                "service_uuids": [HR_UUID, BATTERY_UUID],
                "manufacturer_ids": [107],
                "min_rssi_dbm": -70,
            },
        }
    )
    hit = ble(service_uuids=(BATTERY_UUID,), manufacturer_data={107: b"\x01"}, rssi=-70)
    assert matches_scope(scope, hit)
    assert not matches_scope(
        scope, ble(service_uuids=(BATTERY_UUID,), manufacturer_data={107: b""}, rssi=-71)
    )
    assert not matches_scope(scope, ble(service_uuids=(), manufacturer_data={107: b""}, rssi=-50))
    assert not matches_scope(scope, ble(service_uuids=(HR_UUID,), manufacturer_data={76: b""}, rssi=-50))


def test_ble_uuid_case_name_prefix_and_address() -> None:
    scope = scope_of({"transport": "ble", "filters": {"service_uuids": [HR_UUID], "name_prefix": "Polar"}})
    assert matches_scope(scope, ble(service_uuids=(HR_UUID.upper(),), name="Polar H10"))
    assert not matches_scope(scope, ble(service_uuids=(HR_UUID,), name="polar H10"))
    assert not matches_scope(scope, ble(service_uuids=(HR_UUID,), name=None))
    by_address = scope_of({"transport": "ble", "filters": {"addresses": ["c2:00:00:00:00:01"]}})
    assert matches_scope(by_address, ble(address="C2:00:00:00:00:01"))
    assert matches_scope(by_address, ble(address="c2:00:00:00:00:01"))
    assert not matches_scope(by_address, ble(address="C2:00:00:00:00:02"))


def test_each_exclusion_key_excludes_on_its_own() -> None:
    scope = scope_of(
        {
            "transport": "ble",
            "filters": {"min_rssi_dbm": -90},
            "exclusions": {"manufacturer_ids": [76], "name_prefix": "Hidden"},
        }
    )
    assert matches_scope(scope, ble(manufacturer_data={6: b""}, name="Lamp"))
    assert not matches_scope(scope, ble(manufacturer_data={76: b""}, name="Lamp"))
    assert not matches_scope(scope, ble(manufacturer_data={6: b""}, name="Hidden lamp"))
    assert not matches_scope(scope, ble(rssi=-95))


def test_usb_vid_pid_and_serial() -> None:
    scope = scope_of({"transport": "usb-serial", "filters": {"vid_pid": [{"vid": 0x0403, "pid": 0x6001}]}})
    assert matches_scope(scope, usb(vid=0x0403, pid=0x6001))
    assert not matches_scope(scope, usb(vid=0x0403, pid=0x6015))
    # A port without USB information (ttyS0) never matches a vid/pid filter.
    assert not matches_scope(scope, usb(device="/dev/ttyS0"))
    assert not matches_scope(scope, usb(vid=0x0403))
    by_serial = scope_of({"transport": "usb-serial", "filters": {"serial_numbers": ["FAKE-1"]}})
    assert matches_scope(by_serial, usb(serial_number="FAKE-1"))
    assert not matches_scope(by_serial, usb(serial_number="FAKE-2"))
    assert not matches_scope(by_serial, usb())


def test_usb_removals_are_judged_on_what_they_carry() -> None:
    scope = scope_of({"transport": "usb-serial", "filters": {"vid_pid": [{"vid": 0x0403, "pid": 0x6001}]}})
    assert matches_scope(scope, usb(event="remove"))
    assert matches_scope(scope, usb(event="remove", vid=0x0403, pid=0x6001))
    assert not matches_scope(scope, usb(event="remove", vid=0x10C4, pid=0xEA60))
    excluding = scope_of(
        {
            "transport": "usb-serial",
            "filters": {"vid_pid": [{"vid": 1, "pid": 2}]},
            "exclusions": {"serial_numbers": ["X"]},
        }
    )
    assert matches_scope(excluding, usb(event="remove"))
    assert not matches_scope(excluding, usb(event="remove", serial_number="X"))


def test_usb_exclusions() -> None:
    scope = scope_of(
        {
            "transport": "usb-serial",
            "filters": {"vid_pid": [{"vid": 0x0403, "pid": 0x6001}]},
            "exclusions": {"serial_numbers": ["BENCH-PSU"]},
        }
    )
    assert matches_scope(scope, usb(vid=0x0403, pid=0x6001, serial_number="OTHER"))
    assert matches_scope(scope, usb(vid=0x0403, pid=0x6001))
    assert not matches_scope(scope, usb(vid=0x0403, pid=0x6001, serial_number="BENCH-PSU"))


def test_mdns_types_compare_normalised_and_instance_prefix() -> None:
    scope = scope_of(
        {"transport": "mdns", "filters": {"service_types": ["_http._tcp.local."], "instance_prefix": "Lab"}}
    )
    assert matches_scope(scope, mdns("Lab cam._http._tcp.local.", service_type="_http._tcp.local"))
    assert matches_scope(scope, mdns("Lab cam._http._tcp.local.", service_type="_HTTP._tcp."))
    assert not matches_scope(scope, mdns("Office cam._http._tcp.local.", service_type="_http._tcp.local."))
    assert not matches_scope(scope, mdns("Lab printer._ipp._tcp.local.", service_type="_ipp._tcp.local."))
    assert matches_scope(scope, mdns("Lab cam._http._tcp.local.", event="remove", service_type="_http._tcp"))
    excluding = scope_of(
        {
            "transport": "mdns",
            "filters": {"service_types": ["_http._tcp"]},
            "exclusions": {"instance_prefix": "Lab"},
        }
    )
    assert not matches_scope(excluding, mdns("Lab cam._http._tcp.local.", service_type="_http._tcp.local."))
    assert matches_scope(excluding, mdns("Hall cam._http._tcp.local.", service_type="_http._tcp.local."))


def test_another_transport_never_matches() -> None:
    ble_scope = scope_of({"transport": "ble", "filters": {"min_rssi_dbm": -127}})
    assert not matches_scope(ble_scope, usb(vid=1, pid=2))
    assert not matches_scope(ble_scope, mdns())
    usb_scope = scope_of({"transport": "usb-serial", "filters": {"serial_numbers": ["A"]}})
    assert not matches_scope(usb_scope, ble())
    assert not matches_scope(usb_scope, mdns())


def test_mdns_instance_strips_the_service_type() -> None:
    assert mdns_instance("Lab printer._ipp._tcp.local.", "_ipp._tcp.local.") == "Lab printer"
    assert mdns_instance("Lab printer._ipp._tcp.local", "_ipp._tcp") == "Lab printer"
    assert mdns_instance("Lab printer._IPP._tcp.local.", "_ipp._tcp.local.") == "Lab printer"
    assert mdns_instance("Lab printer", "_ipp._tcp.local.") == "Lab printer"


def test_matcher_is_built_once_per_scope_and_dies_with_it() -> None:
    scope = scope_of({"transport": "ble", "filters": {"addresses": ["C2:00:00:00:00:09"]}})
    assert scope_matcher(scope) is scope_matcher(scope)
    compiled = weakref.ref(scope_matcher(scope))
    del scope
    gc.collect()
    assert compiled() is None


def test_redacted_scope_keeps_only_durable_values() -> None:
    scope = scope_of(
        {
            "transport": "ble",
            "filters": {
                "service_uuids": [HR_UUID],
                "manufacturer_ids": [107],
                "min_rssi_dbm": -80,
                "name_prefix": "secret-name",
                "addresses": ["C2:00:00:00:00:01"],
            },
            "exclusions": {
                "name_prefix": "secret-excl",
                "addresses": ["C2:00:00:00:00:02"],
                "manufacturer_ids": [4242],
            },
            "adapter": "hci0",
        }
    )
    assert redacted_scope(scope) == {
        "transport": "ble",
        "window_seconds": 10,
        "limits": {"max_candidates": 64, "max_snapshot_bytes": 65536},
        "filters": {"service_uuids": [HR_UUID], "manufacturer_ids": [107], "min_rssi_dbm": -80},
        "filters_redacted": ["name_prefix"],
        "exclusions": ["manufacturer_ids", "name_prefix"],
        "adapter": "hci0",
    }
    usb_scope = scope_of(
        {"transport": "usb-serial", "filters": {"vid_pid": [{"vid": 1, "pid": 2}], "serial_numbers": ["SN"]}}
    )
    assert redacted_scope(usb_scope)["filters"] == {"vid_pid": [{"vid": 1, "pid": 2}]}
    mdns_scope = scope_of(
        {"transport": "mdns", "filters": {"service_types": ["_ipp._tcp"], "instance_prefix": "Lab"}}
    )
    assert redacted_scope(mdns_scope)["filters"] == {"service_types": ["_ipp._tcp.local."]}
    assert redacted_scope(mdns_scope)["filters_redacted"] == ["instance_prefix"]


def test_backend_hint_is_positive_filters_only() -> None:
    scope = scope_of(
        {
            "transport": "ble",
            "filters": {"service_uuids": [HR_UUID], "min_rssi_dbm": -80, "name_prefix": "P"},
            "exclusions": {"manufacturer_ids": [76]},
        }
    )
    assert backend_filter_hint(scope) == {"service_uuids": [HR_UUID], "min_rssi_dbm": -80}


# -- property: the compiled matcher equals a plain reading of CONTRACT §6.1
# ------------------------------------

UUIDS = [HR_UUID, BATTERY_UUID, "0000181a-0000-1000-8000-00805f9b34fb"]
NAMES = [None, "", "Polar H10", "Pol", "polar", "Lamp"]
ADDRESSES = ["C2:00:00:00:00:01", "c2:00:00:00:00:02", "C2:00:00:00:00:03"]


def _reference_ble(f: ScopeFilter, o: BleObservation, exclusion: bool) -> list[bool]:
    """One boolean per key set in `f`."""
    checks = []
    if f.service_uuids:
        checks.append(any(u.lower() in f.service_uuids for u in o.service_uuids))
    if f.manufacturer_ids:
        checks.append(any(m in f.manufacturer_ids for m in o.manufacturer_data))
    if f.name_prefix is not None:
        checks.append(o.name is not None and o.name.startswith(f.name_prefix))
    if f.min_rssi_dbm is not None:
        checks.append(o.rssi >= f.min_rssi_dbm)
    if f.addresses:
        checks.append(o.address.upper() in f.addresses)
    return checks


def _reference_usb(f: ScopeFilter, o: UsbObservation, exclusion: bool) -> list[bool]:
    lenient = o.event == "remove" and not exclusion
    checks = []
    if f.vid_pid:
        if o.vid is None or o.pid is None:
            checks.append(lenient)
        else:
            checks.append((o.vid, o.pid) in f.vid_pid)
    if f.serial_numbers:
        checks.append(lenient if o.serial_number is None else o.serial_number in f.serial_numbers)
    return checks


def _reference_mdns(f: ScopeFilter, o: MdnsObservation, exclusion: bool) -> list[bool]:
    checks = []
    if f.service_types:
        checks.append(normalise_service_type(o.service_type) in f.service_types)
    if f.instance_prefix is not None:
        checks.append(mdns_instance(o.name, o.service_type).startswith(f.instance_prefix))
    return checks


def reference(scope: DiscoveryScope, observation: Observation) -> bool:
    """CONTRACT §6.1 read literally: transport, every filter key, no exclusion key."""
    if observation.transport != scope.transport:
        return False
    checks: Callable[[ScopeFilter, Any, bool], list[bool]] = {
        "ble": _reference_ble,
        "usb-serial": _reference_usb,
        "mdns": _reference_mdns,
    }[scope.transport]  # type: ignore[assignment]
    if not all(checks(scope.filters, observation, False)):
        return False
    if scope.exclusions is None:
        return True
    return not any(checks(scope.exclusions, observation, True))


def _ble_filter() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {},
        optional={
            "service_uuids": st.lists(st.sampled_from(UUIDS), min_size=1, max_size=2),
            "manufacturer_ids": st.lists(st.sampled_from([6, 76, 107]), min_size=1, max_size=2),
            "name_prefix": st.sampled_from(["Pol", "Polar", "L"]),
            "min_rssi_dbm": st.integers(-100, -40),
            "addresses": st.lists(st.sampled_from(ADDRESSES), min_size=1, max_size=2),
        },
    )


ble_observations = st.builds(
    BleObservation,
    address=st.sampled_from(ADDRESSES),
    rssi=st.integers(-110, -30),
    name=st.sampled_from(NAMES),
    service_uuids=st.lists(st.sampled_from([*UUIDS, HR_UUID.upper()]), max_size=3).map(tuple),
    manufacturer_data=st.dictionaries(st.sampled_from([6, 76, 107]), st.just(b"\x00"), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(filters=_ble_filter(), exclusions=st.none() | _ble_filter(), observation=ble_observations)
def test_ble_matcher_equals_reference(
    filters: dict[str, Any], exclusions: dict[str, Any] | None, observation: BleObservation
) -> None:
    raw: dict[str, Any] = {"transport": "ble", "filters": filters or {"min_rssi_dbm": -128}}
    if exclusions is not None:
        raw["exclusions"] = exclusions
    scope = scope_of(raw)
    assert matches_scope(scope, observation) is reference(scope, observation)


def _usb_filter() -> st.SearchStrategy[dict[str, Any]]:
    pairs = st.sampled_from([{"vid": 0x0403, "pid": 0x6001}, {"vid": 0x10C4, "pid": 0xEA60}])
    return st.fixed_dictionaries(
        {},
        optional={
            "vid_pid": st.lists(pairs, min_size=1, max_size=2),
            "serial_numbers": st.lists(st.sampled_from(["A", "B"]), min_size=1, max_size=2),
        },
    )


usb_observations = st.builds(
    UsbObservation,
    event=st.sampled_from(["add", "remove"]),
    device=st.just("/dev/ttyUSB0"),
    vid=st.sampled_from([None, 0x0403, 0x10C4]),
    pid=st.sampled_from([None, 0x6001, 0xEA60]),
    serial_number=st.sampled_from([None, "A", "B", "C"]),
)


@settings(max_examples=300, deadline=None)
@given(filters=_usb_filter(), exclusions=st.none() | _usb_filter(), observation=usb_observations)
def test_usb_matcher_equals_reference(
    filters: dict[str, Any], exclusions: dict[str, Any] | None, observation: UsbObservation
) -> None:
    raw: dict[str, Any] = {"transport": "usb-serial", "filters": filters or {"serial_numbers": ["A"]}}
    if exclusions is not None:
        raw["exclusions"] = exclusions
    scope = scope_of(raw)
    assert matches_scope(scope, observation) is reference(scope, observation)


mdns_observations = st.builds(
    MdnsObservation,
    event=st.sampled_from(["add", "update", "remove"]),
    service_type=st.sampled_from(["_http._tcp.local.", "_HTTP._tcp", "_ipp._tcp.local."]),
    name=st.sampled_from(
        ["Lab cam._http._tcp.local.", "Hall._ipp._tcp.local.", "Lab printer._ipp._tcp.local."]
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    types=st.lists(st.sampled_from(["_http._tcp", "_ipp._tcp.local."]), min_size=1, max_size=2),
    prefix=st.none() | st.sampled_from(["Lab", "Hall"]),
    excluded=st.none() | st.sampled_from(["Lab", "Hall"]),
    observation=mdns_observations,
)
def test_mdns_matcher_equals_reference(
    types: list[str], prefix: str | None, excluded: str | None, observation: MdnsObservation
) -> None:
    raw: dict[str, Any] = {"transport": "mdns", "filters": {"service_types": types}}
    if prefix is not None:
        raw["filters"]["instance_prefix"] = prefix
    if excluded is not None:
        raw["exclusions"] = {"instance_prefix": excluded}
    scope = scope_of(raw)
    assert matches_scope(scope, observation) is reference(scope, observation)
