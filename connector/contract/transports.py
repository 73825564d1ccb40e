"""The transports a discovery action may name (SPEC 6.1): pure data, shared by the catalog and the core."""

from __future__ import annotations

from typing import Literal

Transport = Literal["ble", "usb-serial", "mdns"]
TRANSPORTS: tuple[Transport, ...] = ("ble", "usb-serial", "mdns")
