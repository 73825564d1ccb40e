"""What a provider hands to a session: one frozen observation per advert, port change or mDNS record.

Observations hold private device data (addresses, payloads). They live in memory only and never leave
the session except through the caller-private projection and, for the address, a binding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

from connector.contract.transports import Transport

_NO_PAYLOAD: Mapping[Any, bytes] = MappingProxyType({})


class BleObservation(NamedTuple):
    """One BLE advertisement as the backend reported it.

    A NamedTuple rather than a frozen dataclass: it is built once per advert on the hot path, and a
    frozen dataclass costs about 2.5x more to construct. Immutable all the same.
    """

    address: str
    rssi: int
    name: str | None = None
    service_uuids: tuple[str, ...] = ()
    manufacturer_data: Mapping[int, bytes] = _NO_PAYLOAD
    service_data: Mapping[str, bytes] = _NO_PAYLOAD
    tx_power: int | None = None
    connectable: bool | None = None

    @property
    def transport(self) -> Literal["ble"]:
        """Always `ble`."""
        return "ble"

    @property
    def device_key(self) -> str:
        """Per-session dedupe key."""
        return self.address


@dataclass(frozen=True, slots=True)
class UsbObservation:
    """A serial port appearing or disappearing in an enumeration pass."""

    event: Literal["add", "remove"]
    device: str
    vid: int | None = None
    pid: int | None = None
    serial_number: str | None = None
    manufacturer: str | None = None
    product: str | None = None
    location: str | None = None
    interface: str | None = None
    # The `/dev/serial/by-id/...` link naming this port, when udev made one: it survives a replug (CONTRACT
    # §6.8).
    stable_path: str | None = None

    transport: Transport = "usb-serial"

    @property
    def device_key(self) -> str:
        """Per-session dedupe key."""
        return self.device


@dataclass(frozen=True, slots=True)
class MdnsObservation:
    """An mDNS service instance added, updated or removed."""

    event: Literal["add", "update", "remove"]
    service_type: str
    name: str
    server: str | None = None
    addresses: tuple[str, ...] = ()
    port: int | None = None
    txt: Mapping[str, str] = field(default_factory=dict)
    ttl: int | None = None

    transport: Transport = "mdns"

    @property
    def device_key(self) -> str:
        """Per-session dedupe key."""
        return f"{self.service_type}\x00{self.name}"


Observation = BleObservation | UsbObservation | MdnsObservation
