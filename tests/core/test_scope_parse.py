"""Parsing a discovery input (CONTRACT §6.1): clamping, every refusal path, the CLI forms."""

from __future__ import annotations

from typing import Any

import pytest

from connector.cli.scope_forms import scope_input_from_cli
from connector.core.scope import (
    DiscoveryScope,
    ScopeFilter,
    expand_uuid,
    normalise_service_type,
    normalised_input,
    parse_discovery_input,
)
from connector.errors import AdmissionError
from tests.core.builders import CATALOG_PROFILE, HR_UUID, profile

CANARY = "canary-7f3a9"


def refusal(raw: Any, prof: Any = CATALOG_PROFILE, **kwargs: Any) -> list[str]:
    """The `path: rule` messages of a refused input."""
    with pytest.raises(AdmissionError) as caught:
        parse_discovery_input(raw, prof, **kwargs)
    error = caught.value
    assert error.code == "invalid-input"
    assert error.http_status == 422
    assert all(d["code"] == "invalid-input" for d in error.diagnostics)
    return [d["message"] for d in error.diagnostics]


def test_ble_input_parses_and_keeps_every_key() -> None:
    raw = {
        "transport": "ble",
        "window_seconds": 30,
        "filters": {
            "service_uuids": [HR_UUID],
            "manufacturer_ids": [76, 6],
            "name_prefix": "Polar",
            "min_rssi_dbm": -80,
            "addresses": ["c2:00:00:00:00:01"],
        },
        "exclusions": {"manufacturer_ids": [6]},
        "adapter": "hci0",
    }
    scope = parse_discovery_input(raw, CATALOG_PROFILE)
    assert scope == DiscoveryScope(
        transport="ble",
        window_seconds=30,
        max_candidates=64,
        max_snapshot_bytes=65536,
        filters=ScopeFilter(
            service_uuids=(HR_UUID,),
            manufacturer_ids=(76, 6),
            name_prefix="Polar",
            min_rssi_dbm=-80,
            addresses=("C2:00:00:00:00:01",),
        ),
        exclusions=ScopeFilter(manufacturer_ids=(6,)),
        adapter="hci0",
        cleanup_timeout_ms=2000,
    )


def test_usb_and_mdns_inputs_parse() -> None:
    usb = parse_discovery_input(
        {
            "transport": "usb-serial",
            "window_seconds": 5,
            "filters": {"vid_pid": [{"vid": 0x0403, "pid": 0x6001}], "serial_numbers": ["FT-FAKE-1"]},
        },
        CATALOG_PROFILE,
    )
    assert usb.filters == ScopeFilter(vid_pid=((0x0403, 0x6001),), serial_numbers=("FT-FAKE-1",))
    mdns = parse_discovery_input(
        {
            "transport": "mdns",
            "window_seconds": 5,
            "filters": {"service_types": ["_ipp._tcp", "_HTTP._tcp.local."], "instance_prefix": "Lab"},
        },
        CATALOG_PROFILE,
    )
    assert mdns.filters.service_types == ("_ipp._tcp.local.", "_http._tcp.local.")
    assert mdns.filters.instance_prefix == "Lab"


def test_limits_are_clamped_down_never_up() -> None:
    raw = {"transport": "ble", "window_seconds": 5, "filters": {"min_rssi_dbm": -90}}
    assert parse_discovery_input(raw, CATALOG_PROFILE).max_candidates == 64
    narrowed = parse_discovery_input(
        {**raw, "limits": {"max_candidates": 8, "max_snapshot_bytes": 4096}}, CATALOG_PROFILE
    )
    assert (narrowed.max_candidates, narrowed.max_snapshot_bytes) == (8, 4096)
    widened = parse_discovery_input(
        {**raw, "limits": {"max_candidates": 10_000, "max_snapshot_bytes": 10**9}}, CATALOG_PROFILE
    )
    assert (widened.max_candidates, widened.max_snapshot_bytes) == (64, 65536)


def test_window_bounds_and_timeout() -> None:
    raw = {"transport": "ble", "filters": {"min_rssi_dbm": -90}}
    assert parse_discovery_input({**raw, "window_seconds": 60}, CATALOG_PROFILE).window_seconds == 60
    assert parse_discovery_input({**raw, "window_seconds": 10}, CATALOG_PROFILE, timeout_ms=10_000)
    assert refusal({**raw, "window_seconds": 11}, timeout_ms=10_000) == [
        "/input/window_seconds: window-exceeds-timeout"
    ]
    assert refusal({**raw, "window_seconds": 0}) == ["/input/window_seconds: minimum"]
    assert refusal({**raw, "window_seconds": 61}) == ["/input/window_seconds: maximum"]
    assert refusal({**raw, "window_seconds": True}) == ["/input/window_seconds: integer"]
    assert refusal({**raw, "window_seconds": 1.5}) == ["/input/window_seconds: integer"]
    assert refusal(raw) == ["/input/window_seconds: required"]


def test_unfiltered_needs_the_profile_to_allow_it() -> None:
    raw = {"transport": "ble", "window_seconds": 5}
    assert refusal(raw) == ["/input/filters: at-least-one-filter"]
    assert refusal({**raw, "filters": {}}) == ["/input/filters: at-least-one-filter"]
    scope = parse_discovery_input(raw, profile(allow_unfiltered=True))
    assert scope.filters == ScopeFilter()


def test_mdns_requires_service_types_even_when_unfiltered_is_allowed() -> None:
    raw = {"transport": "mdns", "window_seconds": 5, "filters": {"instance_prefix": "Lab"}}
    assert refusal(raw) == ["/input/filters/service_types: required"]
    assert refusal(raw, profile(allow_unfiltered=True)) == ["/input/filters/service_types: required"]


BASE = {"transport": "ble", "window_seconds": 5, "filters": {"min_rssi_dbm": -90}}

REFUSALS: list[tuple[dict[str, Any], list[str]]] = [
    ({**BASE, "transport": "zigbee"}, ["/input/transport: enum"]),
    ({"window_seconds": 5, "filters": {"min_rssi_dbm": -90}}, ["/input/transport: required"]),
    ({**BASE, CANARY: 1}, ["/input: unknown-key"]),
    ({**BASE, "filters": {"min_rssi_dbm": -90, CANARY: 1}}, ["/input/filters: unknown-key"]),
    ({**BASE, "filters": {"vid_pid": [{"vid": 1, "pid": 2}]}}, ["/input/filters/vid_pid: not-for-transport"]),
    ({**BASE, "filters": [CANARY]}, ["/input/filters: object", "/input/filters: at-least-one-filter"]),
    (
        {**BASE, "filters": {"service_uuids": ["180"]}},
        ["/input/filters/service_uuids/0: uuid"],
    ),
    (
        {**BASE, "filters": {"service_uuids": [CANARY, 7]}},
        ["/input/filters/service_uuids/0: uuid", "/input/filters/service_uuids/1: uuid"],
    ),
    (
        {**BASE, "filters": {"min_rssi_dbm": -90, "name_prefx": "x"}},
        ["/input/filters/name_prefx: unknown-key"],
    ),
    ({**BASE, "window": 5}, ["/input/window: unknown-key"]),
    ({**BASE, "filters": {"service_uuids": []}}, ["/input/filters/service_uuids: min-items"]),
    ({**BASE, "filters": {"service_uuids": [HR_UUID] * 65}}, ["/input/filters/service_uuids: max-items"]),
    ({**BASE, "filters": {"service_uuids": HR_UUID}}, ["/input/filters/service_uuids: array"]),
    ({**BASE, "filters": {"manufacturer_ids": ["76"]}}, ["/input/filters/manufacturer_ids/0: integer"]),
    ({**BASE, "filters": {"manufacturer_ids": [65536]}}, ["/input/filters/manufacturer_ids/0: maximum"]),
    ({**BASE, "filters": {"manufacturer_ids": [-1]}}, ["/input/filters/manufacturer_ids/0: minimum"]),
    ({**BASE, "filters": {"name_prefix": ""}}, ["/input/filters/name_prefix: min-length"]),
    ({**BASE, "filters": {"name_prefix": "x" * 257}}, ["/input/filters/name_prefix: max-length"]),
    ({**BASE, "filters": {"name_prefix": 7}}, ["/input/filters/name_prefix: string"]),
    ({**BASE, "filters": {"min_rssi_dbm": -129}}, ["/input/filters/min_rssi_dbm: minimum"]),
    ({**BASE, "filters": {"min_rssi_dbm": "-70"}}, ["/input/filters/min_rssi_dbm: integer"]),
    ({**BASE, "filters": {"addresses": [CANARY * 30]}}, ["/input/filters/addresses/0: max-length"]),
    ({**BASE, "limits": {"max_candidates": 0}}, ["/input/limits/max_candidates: minimum"]),
    ({**BASE, "limits": {"max_snapshot_bytes": 16}}, ["/input/limits/max_snapshot_bytes: minimum"]),
    ({**BASE, "limits": {CANARY: 1}}, ["/input/limits: unknown-key"]),
    ({**BASE, "limits": 5}, ["/input/limits: object"]),
    (
        {**BASE, "exclusions": {"serial_numbers": ["x"]}},
        ["/input/exclusions/serial_numbers: not-for-transport"],
    ),
    ({**BASE, "adapter": CANARY + " ; rm"}, ["/input/adapter: adapter-name"]),
    ({**BASE, "adapter": 3}, ["/input/adapter: adapter-name"]),
    (
        {"transport": "usb-serial", "window_seconds": 5, "filters": {"vid_pid": [{"vid": 1, "pid": 70000}]}},
        ["/input/filters/vid_pid/0/pid: maximum"],
    ),
    (
        {"transport": "usb-serial", "window_seconds": 5, "filters": {"vid_pid": [{"vid": -1}]}},
        ["/input/filters/vid_pid/0/vid: minimum", "/input/filters/vid_pid/0/pid: required"],
    ),
    (
        {
            "transport": "usb-serial",
            "window_seconds": 5,
            "filters": {"vid_pid": [{"vid": 1, "pid": 2, "x": 3}]},
        },
        ["/input/filters/vid_pid/0/x: unknown-key"],
    ),
    (
        {"transport": "usb-serial", "window_seconds": 5, "filters": {"vid_pid": ["0403-6001", 7]}},
        ["/input/filters/vid_pid/0: vid-pid", "/input/filters/vid_pid/1: vid-pid"],
    ),
    (
        {"transport": "usb-serial", "window_seconds": 5, "filters": {"vid_pid": ["10403:6001"]}},
        ["/input/filters/vid_pid/0: vid-pid"],
    ),
    (
        {"transport": "mdns", "window_seconds": 5, "filters": {"service_types": ["http"]}},
        ["/input/filters/service_types/0: service-type"],
    ),
]


@pytest.mark.parametrize(("raw", "expected"), REFUSALS)
def test_refusals_name_paths_and_rules_only(raw: dict[str, Any], expected: list[str]) -> None:
    messages = refusal(raw)
    assert messages == expected
    assert not any(CANARY in message for message in messages)


def test_every_problem_is_reported_at_once() -> None:
    messages = refusal(
        {"transport": "ble", "window_seconds": 0, "filters": {"manufacturer_ids": [-1]}, "adapter": "!"}
    )
    assert messages == [
        "/input/window_seconds: minimum",
        "/input/filters/manufacturer_ids/0: minimum",
        "/input/adapter: adapter-name",
    ]


def test_a_transport_outside_the_profile_is_refused() -> None:
    # The filters are not judged against a transport that is refused anyway.
    assert refusal({**BASE, "transport": "usb-serial"}, profile(transports=("ble",))) == [
        "/input/transport: transport-not-allowed"
    ]


def test_input_must_be_an_object() -> None:
    assert refusal([CANARY]) == ["/input: object"]


def test_refusal_message_and_document_hold_no_values() -> None:
    with pytest.raises(AdmissionError) as caught:
        parse_discovery_input({**BASE, "filters": {"name_prefix": 7, CANARY: CANARY}}, CATALOG_PROFILE)
    assert CANARY not in str(caught.value.to_document())


def test_duplicates_collapse() -> None:
    scope = parse_discovery_input(
        {**BASE, "filters": {"manufacturer_ids": [76, 76, 6], "service_uuids": [HR_UUID, HR_UUID]}},
        CATALOG_PROFILE,
    )
    assert scope.filters.manufacturer_ids == (76, 6)
    assert scope.filters.service_uuids == (HR_UUID,)


def test_an_empty_exclusions_object_means_none() -> None:
    assert parse_discovery_input({**BASE, "exclusions": {}}, CATALOG_PROFILE).exclusions is None


# -- CLI forms ----------------------------------------------------------------------------------------------


def test_cli_forms_build_the_json_input() -> None:
    raw = scope_input_from_cli(
        "ble",
        20,
        [
            "service_uuid=180d",
            "service_uuid=0000180F",
            "manufacturer_id=76",
            "name_prefix=Polar",
            "min_rssi_dbm=-75",
            "address=C2:00:00:00:00:01",
        ],
        ["manufacturer_id=6"],
        8,
        "hci1",
    )
    assert raw == {
        "transport": "ble",
        "window_seconds": 20,
        "filters": {
            "service_uuids": [HR_UUID, "0000180f-0000-1000-8000-00805f9b34fb"],
            "manufacturer_ids": [76],
            "name_prefix": "Polar",
            "min_rssi_dbm": -75,
            "addresses": ["C2:00:00:00:00:01"],
        },
        "exclusions": {"manufacturer_ids": [6]},
        "limits": {"max_candidates": 8},
        "adapter": "hci1",
    }
    assert parse_discovery_input(raw, CATALOG_PROFILE).max_candidates == 8


def test_cli_usb_and_mdns_forms() -> None:
    raw = scope_input_from_cli(
        "usb-serial", 5, ["vid_pid=0403:6001", "vid_pid=2341:0043", "serial_number=FAKE1"], [], None, None
    )
    assert raw["filters"] == {
        "vid_pid": [{"vid": 0x0403, "pid": 0x6001}, {"vid": 0x2341, "pid": 0x0043}],
        "serial_numbers": ["FAKE1"],
    }
    assert "limits" not in raw and "adapter" not in raw and "exclusions" not in raw
    mdns = scope_input_from_cli("mdns", 5, ["service_type=_ipp._tcp", "instance_prefix=Lab"], [], None, None)
    assert mdns["filters"] == {"service_types": ["_ipp._tcp"], "instance_prefix": "Lab"}
    assert parse_discovery_input(mdns, CATALOG_PROFILE).filters.service_types == ("_ipp._tcp.local.",)


def test_cli_without_filters_leaves_the_refusal_to_parsing() -> None:
    raw = scope_input_from_cli("ble", 5, [], [], None, None)
    assert "filters" not in raw
    assert refusal(raw) == ["/input/filters: at-least-one-filter"]


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ([CANARY], "--filter/0: key-value-form"),
        ([f"{CANARY}=1"], "--filter/0: unknown-key"),
        (["service_uuid=18"], "--filter/0/service_uuid: value-form"),
        ([f"service_uuid={CANARY}"], "--filter/0/service_uuid: value-form"),
        (["manufacturer_id=0x1004c"], "--filter/0/manufacturer_id: value-form"),  # 0x hex: at most ffff
        (["vid_pid=0403-6001"], "--filter/0/vid_pid: value-form"),
        (["vid_pid=12345:1"], "--filter/0/vid_pid: value-form"),
        (["min_rssi_dbm=strong"], "--filter/0/min_rssi_dbm: value-form"),
        (["name_prefix="], "--filter/0/name_prefix: value-form"),
        (["name_prefix=a", "name_prefix=b"], "--filter/1/name_prefix: repeated-key"),
    ],
)
def test_cli_refusals(filters: list[str], expected: str) -> None:
    with pytest.raises(AdmissionError) as caught:
        scope_input_from_cli("ble", 5, filters, [], None, None)
    assert caught.value.code == "invalid-input"
    messages = [d["message"] for d in caught.value.diagnostics]
    assert messages == [expected]
    assert CANARY not in str(caught.value.to_document())


def test_cli_exclusion_refusals_name_the_exclude_flag() -> None:
    with pytest.raises(AdmissionError) as caught:
        scope_input_from_cli("ble", 5, ["min_rssi_dbm=-80"], ["nonsense"], None, None)
    assert [d["message"] for d in caught.value.diagnostics] == ["--exclude/0: key-value-form"]


def test_uuid_and_service_type_normalisation() -> None:
    assert expand_uuid("180D") == HR_UUID
    assert expand_uuid("0000180d") == HR_UUID
    assert expand_uuid(HR_UUID.upper()) == HR_UUID
    assert expand_uuid("18") is None
    assert expand_uuid("not-a-uuid") is None
    for spelling in ("_http._tcp", "_http._tcp.", "_HTTP._tcp.local", "_http._tcp.local."):
        assert normalise_service_type(spelling) == "_http._tcp.local."


@pytest.mark.parametrize("form", ["180d", "180D", "0000180d", "0000180D", HR_UUID, HR_UUID.upper()])
def test_every_uuid_form_is_admitted_as_lowercase_128_bit(form: str) -> None:
    raw = {"transport": "ble", "window_seconds": 5, "filters": {"service_uuids": [form]}}
    scope = parse_discovery_input(raw, profile())
    assert scope.filters.service_uuids == (HR_UUID,)
    assert normalised_input(raw, scope)["filters"]["service_uuids"] == [HR_UUID]


def test_vid_pid_strings_and_objects_are_one_pair() -> None:
    raw = {
        "transport": "usb-serial",
        "window_seconds": 5,
        "filters": {"vid_pid": ["0403:6001", {"vid": 0x0403, "pid": 0x6001}, "2341:0043"]},
        "exclusions": {"vid_pid": ["abcd:EF01"]},
    }
    scope = parse_discovery_input(raw, profile())
    assert scope.filters.vid_pid == ((0x0403, 0x6001), (0x2341, 0x0043))
    assert scope.exclusions is not None and scope.exclusions.vid_pid == ((0xABCD, 0xEF01),)
    normal = normalised_input(raw, scope)
    assert normal["filters"]["vid_pid"] == [{"vid": 0x0403, "pid": 0x6001}, {"vid": 0x2341, "pid": 0x0043}]
    assert normal["exclusions"]["vid_pid"] == [{"vid": 0xABCD, "pid": 0xEF01}]
