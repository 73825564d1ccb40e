"""Candidate content: what a caller may learn about one device (CONTRACT §6.5), and nothing more.

Rules of this file:
- a candidate never carries a transport address: no BLE MAC, no IP address or port, no device path, no USB
  serial number, no advertisement payload bytes (manufacturer data appears as its company ids only);
- every string is sanitised (control, surrogate and bidi-override characters removed) and bounded, every
  list is sorted and bounded, so two equal devices give equal bytes;
- after sanitising, `json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)` produces the
  RFC 8785 bytes of a candidate (ASCII keys, no floats, only `"` and `\\` left to escape); the table uses
  that to size snapshots without the slower canonicaliser, and the tests hold the two equal.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any, Final

from connector.core.observations import BleObservation, MdnsObservation, Observation, UsbObservation
from connector.core.scope import expand_uuid, mdns_instance, normalise_service_type

CANDIDATE_SCHEMA: Final = "sensorium-device-discovery-candidate.v1"
MAX_LABEL_CHARS: Final = 64
MAX_TEXT_CHARS: Final = 64
MAX_LIST_ITEMS: Final = 64

_REMOVED_CODEPOINTS: Final[dict[int, None]] = dict.fromkeys(
    [
        *range(0x00, 0x20),
        *range(0x7F, 0xA0),
        *range(0xD800, 0xE000),
        *range(0x202A, 0x202F),
        *range(0x2066, 0x206A),
        0x200E,
        0x200F,
        0xFEFF,
    ]
)


def sanitise_text(text: str | None, max_chars: int = MAX_TEXT_CHARS) -> str | None:
    """Printable, bounded text, or None when nothing is left."""
    if text is None:
        return None
    cleaned = text.translate(_REMOVED_CODEPOINTS).strip()[:max_chars].rstrip()
    return cleaned or None


def _uuids(values: Iterable[str]) -> list[str]:
    # Not memoised across sessions on purpose: nothing a device sent may outlive its session's table.
    expanded = {expand_uuid(value) for value in values if isinstance(value, str)}
    return sorted(uuid for uuid in expanded if uuid is not None)[:MAX_LIST_ITEMS]


def _company_ids(values: Iterable[int]) -> list[int]:
    ids = {value for value in values if type(value) is int and 0 <= value <= 0xFFFF}
    return sorted(ids)[:MAX_LIST_ITEMS]


def _small_int(value: object, low: int, high: int) -> int | None:
    return value if type(value) is int and low <= value <= high else None


def ble_content(observation: BleObservation) -> dict[str, Any]:
    """Label and `ble` block of a BLE advert."""
    ble: dict[str, Any] = {
        "service_uuids": _uuids(observation.service_uuids),
        "manufacturer_ids": _company_ids(observation.manufacturer_data),
    }
    if observation.connectable is not None:
        ble["connectable"] = bool(observation.connectable)
    tx_power = _small_int(observation.tx_power, -128, 127)
    if tx_power is not None:
        ble["tx_power"] = tx_power
    content: dict[str, Any] = {"ble": ble}
    label = sanitise_text(observation.name, MAX_LABEL_CHARS)
    if label is not None:
        content["label"] = label
    return content


def usb_content(observation: UsbObservation) -> dict[str, Any]:
    """Label and `usb` block of a serial port; never its device path or serial number."""
    usb: dict[str, Any] = {}
    for key in ("vid", "pid"):
        value = _small_int(getattr(observation, key), 0, 0xFFFF)
        if value is not None:
            usb[key] = value
    for key in ("manufacturer", "product"):
        text = sanitise_text(getattr(observation, key))
        if text is not None:
            usb[key] = text
    interface = usb_interface(observation)
    if interface is not None:
        usb["interface"] = interface
    content: dict[str, Any] = {"usb": usb} if usb else {}
    label = sanitise_text(observation.product or observation.manufacturer, MAX_LABEL_CHARS)
    if label is None and observation.product:
        label = sanitise_text(observation.manufacturer, MAX_LABEL_CHARS)
    if label is not None:
        content["label"] = label
    return content


def usb_interface(observation: UsbObservation) -> str | None:
    """CONTRACT §6.5 `usb.interface`: the interface string, else `interface <n>` on a multi-interface device.

    pyserial 3.5 (`list_ports_linux.py` lines 55-58) gives the interface directory's name as `location` only
    when `bNumInterfaces` > 1; the kernel names it `<bus>-<port path>:<config>.<bInterfaceNumber>`.
    """
    text = sanitise_text(observation.interface, MAX_LABEL_CHARS)
    if text is not None:
        return text
    location = observation.location or ""
    _, colon, config_interface = location.rpartition(":")
    number = config_interface.rpartition(".")[2]
    if colon and number.isdigit():
        return f"interface {int(number)}"
    return None


def mdns_content(observation: MdnsObservation) -> dict[str, Any]:
    """Label and `mdns` block of a service instance; never its host, addresses, port or TXT."""
    mdns: dict[str, Any] = {}
    service_type = sanitise_text(normalise_service_type(observation.service_type))
    if service_type is not None:
        mdns["service_type"] = service_type
    instance = sanitise_text(mdns_instance(observation.name, observation.service_type), MAX_LABEL_CHARS)
    if instance is not None:
        mdns["instance"] = instance
    content: dict[str, Any] = {"mdns": mdns}
    if instance is not None:
        content["label"] = instance
    return content


def candidate_content(observation: Observation, *, include_signal: bool = True) -> dict[str, Any]:
    """The private, address-free candidate fields of one observation (CONTRACT §6.5)."""
    if isinstance(observation, BleObservation):
        content = ble_content(observation)
        rssi = observation.rssi
        if include_signal and type(rssi) is int:
            content["signal"] = {"rssi_dbm": rssi}
        return content
    if isinstance(observation, UsbObservation):
        return usb_content(observation)
    return mdns_content(observation)


_SECOND_CACHE: dict[int, str] = {}


def format_second(epoch_seconds: int) -> str:
    """RFC 3339 UTC at whole-second precision (`2026-11-30T12:00:01Z`), memoised for the hot path."""
    text = _SECOND_CACHE.get(epoch_seconds)
    if text is None:
        if len(_SECOND_CACHE) >= 8192:
            _SECOND_CACHE.clear()
        text = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_seconds))
        _SECOND_CACHE[epoch_seconds] = text
    return text


def format_ms(epoch_ms: int) -> str:
    """RFC 3339 UTC: whole seconds when exact, else milliseconds (`...T12:00:01.250Z`)."""
    seconds, millis = divmod(epoch_ms, 1000)
    text = format_second(seconds)
    return text if millis == 0 else f"{text[:-1]}.{millis:03d}Z"


_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def candidate_size(value: Any) -> int:
    """Canonical byte length of a sanitised candidate value (see the header for why this is exact)."""
    return len(_ENCODER.encode(value).encode("utf-8"))


def merged_size(first_size: int, second: dict[str, Any]) -> int:
    """Canonical length of an object with `first`'s members (`first_size` bytes) and `second`'s merged in.

    `{a}` and `{b}` merge into `{a,b}`: one pair of braces fewer, one comma more (keys are disjoint).
    """
    if not second:
        return first_size
    return first_size + candidate_size(second) - 1
