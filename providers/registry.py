"""Choose the provider for a transport: the replay backend when a fixture is given, else the real library."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from connector.contract.transports import Transport
from connector.core.transports import TRANSPORT_FACTS
from connector.errors import ProviderUnavailable
from connector.timer import WALL_TIMER, Timer
from providers.base import Provider
from providers.replay import FixtureError, ReplayProvider


def build_provider(
    transport: Transport,
    *,
    replay: Path | None = None,
    replay_speed: float = 1.0,
    ble_adapter: str | None = None,
    mdns_interfaces: Sequence[str] | str | None = None,
    every_report: bool = False,
    timer: Timer = WALL_TIMER,
) -> Provider:
    """The provider for `transport`; raises ProviderUnavailable when its backend cannot be loaded.

    A replay plays on `timer`; a real backend waits on its real peer, on the wall clock.
    """
    if replay is not None:
        provider = ReplayProvider(replay, speed=replay_speed, timer=timer)
        if provider.capabilities.transport != transport:
            raise FixtureError("replay fixture transport does not match the scan transport")
        return provider
    if transport not in TRANSPORT_FACTS:
        raise ProviderUnavailable("provider not available for this transport")
    facts = TRANSPORT_FACTS[transport]
    module_name, class_name = facts.provider
    backend = getattr(_load(module_name), class_name)
    offered = _offered(ble_adapter, mdns_interfaces, every_report)
    return cast(Provider, backend(**{option: offered[option] for option in facts.provider_options}))


def _offered(
    ble_adapter: str | None,
    mdns_interfaces: Sequence[str] | str | None,
    every_report: bool,
) -> dict[str, Any]:
    """Every backend option by name; a backend takes those its transport's facts list."""
    interfaces = (
        mdns_interfaces
        if mdns_interfaces is None or isinstance(mdns_interfaces, str)
        else list(mdns_interfaces)
    )
    return {"adapter": ble_adapter, "every_report": every_report, "interfaces": interfaces}


def _load(module_name: str) -> ModuleType:
    """Import a backend lazily so that a missing library only affects its own transport."""
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        raise ProviderUnavailable("provider not available: its backend module could not be loaded") from error
