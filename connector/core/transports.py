"""What differs between transports, stated once: a fourth transport is one entry here and one provider.

The scope parser and matcher, the candidate table, the provider registry, the simulated backends, the
recorder and the CLI read these facts instead of comparing transport names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from connector.contract.transports import Transport
from connector.core.observations import BleObservation, MdnsObservation, Observation, UsbObservation


@dataclass(frozen=True, slots=True)
class TransportFacts:
    """The facts of one transport that the rest of the code would otherwise branch on."""

    transport: Transport
    # CONTRACT §6.1 filter keys, in vocabulary order (also the order a matcher tests them in).
    filter_keys: tuple[str, ...]
    # Keys a scan must name whatever the profile allows (mDNS: service types are the browser's only filter).
    required_filters: tuple[str, ...]
    observation: type[Observation]
    # The `event` values its observations carry; BLE adverts carry none (a device just goes quiet).
    events: tuple[str, ...]
    # Whether it reports a signal strength (the RSSI columns of the live view).
    signal: bool
    # The real backend: module and class, lazily imported by the provider registry.
    provider: tuple[str, str]
    # Which of the connector's backend options it takes: `adapter`, `interfaces`, `every_report`.
    provider_options: tuple[str, ...]

    @property
    def removals(self) -> bool:
        """Whether a device's departure is an observation of its own (a USB unplug, an mDNS goodbye)."""
        return "remove" in self.events

    def takes(self, option: str) -> bool:
        """Whether its backend takes `option` (`adapter`: a BLE adapter to choose)."""
        return option in self.provider_options


TRANSPORT_FACTS: Mapping[Transport, TransportFacts] = MappingProxyType(
    {
        "ble": TransportFacts(
            transport="ble",
            filter_keys=("service_uuids", "manufacturer_ids", "name_prefix", "min_rssi_dbm", "addresses"),
            required_filters=(),
            observation=BleObservation,
            events=(),
            signal=True,
            provider=("providers.ble", "BleProvider"),
            provider_options=("adapter", "every_report"),
        ),
        "usb-serial": TransportFacts(
            transport="usb-serial",
            filter_keys=("vid_pid", "serial_numbers"),
            required_filters=(),
            observation=UsbObservation,
            events=("add", "remove"),
            signal=False,
            provider=("providers.serial", "SerialProvider"),
            provider_options=(),
        ),
        "mdns": TransportFacts(
            transport="mdns",
            filter_keys=("service_types", "instance_prefix"),
            required_filters=("service_types",),
            observation=MdnsObservation,
            events=("add", "update", "remove"),
            signal=False,
            provider=("providers.mdns", "MdnsProvider"),
            provider_options=("interfaces",),
        ),
    }
)


def facts(transport: Transport) -> TransportFacts:
    """The facts of `transport`."""
    return TRANSPORT_FACTS[transport]
