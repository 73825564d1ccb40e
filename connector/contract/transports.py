"""The transports a discovery action may name (CONTRACT §6.1): pure data, shared by the catalog and the
core."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

Transport = Literal["ble", "usb-serial", "mdns"]
TRANSPORTS: tuple[Transport, ...] = ("ble", "usb-serial", "mdns")
# The candidate member that carries a transport's details (CONTRACT §6.3).
CONTENT_KEYS: Mapping[Transport, str] = MappingProxyType({"ble": "ble", "usb-serial": "usb", "mdns": "mdns"})
