"""Choose the provider for a transport: the replay backend when a fixture is given, else the real library."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from connector.contract.transports import Transport
from connector.errors import ProviderUnavailable
from providers.base import Provider
from providers.replay import FixtureError, ReplayProvider

_REAL_BACKENDS: dict[str, tuple[str, str]] = {
    "ble": ("providers.ble", "BleProvider"),
    "usb-serial": ("providers.serial", "SerialProvider"),
    "mdns": ("providers.mdns", "MdnsProvider"),
}


def build_provider(
    transport: Transport,
    *,
    replay: Path | None = None,
    replay_speed: float = 1.0,
    ble_adapter: str | None = None,
    mdns_interfaces: Sequence[str] | str | None = None,
    every_report: bool = False,
) -> Provider:
    """The provider for `transport`; raises ProviderUnavailable when its backend cannot be loaded."""
    if replay is not None:
        provider = ReplayProvider(replay, speed=replay_speed)
        if provider.capabilities.transport != transport:
            raise FixtureError("replay fixture transport does not match the scan transport")
        return provider
    if transport not in _REAL_BACKENDS:
        raise ProviderUnavailable("provider not available for this transport")
    module_name, class_name = _REAL_BACKENDS[transport]
    backend = getattr(_load(module_name), class_name)
    return cast(Provider, backend(**_options(transport, ble_adapter, mdns_interfaces, every_report)))


def _options(
    transport: str,
    ble_adapter: str | None,
    mdns_interfaces: Sequence[str] | str | None,
    every_report: bool = False,
) -> dict[str, Any]:
    """Constructor options the real backend of `transport` takes (`every_report`: a recording's BLE)."""
    if transport == "ble":
        return {"adapter": ble_adapter, "every_report": every_report}
    if transport == "mdns":
        if mdns_interfaces is None or isinstance(mdns_interfaces, str):
            return {"interfaces": mdns_interfaces}
        return {"interfaces": list(mdns_interfaces)}
    return {}


def _load(module_name: str) -> ModuleType:
    """Import a backend lazily so that a missing library only affects its own transport."""
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        raise ProviderUnavailable("provider not available: its backend module could not be loaded") from error
