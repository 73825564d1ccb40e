"""The default adapter at admission, answered from bluetoothd's signals after one GetManagedObjects.

Every check of what the link knows follows a round trip to `org.bluez` on the link's own connection: D-Bus
delivers one sender's messages in order, so the signals bluetoothd sent before that reply have been read.
"""

from __future__ import annotations

import pytest

from connector.core.scope import DiscoveryScope, ScopeFilter
from providers.ble import BleProvider, BusLink, bus_link
from tests.providers.bluez_mock import BluezController, bluez

__all__ = ["bluez"]  # the fixture, imported above

pytestmark = pytest.mark.asyncio

SCOPE = DiscoveryScope(
    transport="ble", window_seconds=10, max_candidates=64, max_snapshot_bytes=65536, filters=ScopeFilter()
)


async def _default(provider: BleProvider, link: BusLink) -> str | None:
    """The adapter an admission resolves, after every signal bluetoothd sent so far was read."""
    await link.bluez_answers()
    return await provider.resolve_adapter(SCOPE)


async def _asked(bluez: BluezController, link: BusLink) -> int:
    """GetManagedObjects calls the link made."""
    ours = (await link.bus()).unique_name
    return sum(1 for sender, _path, _args in bluez.calls("GetManagedObjects") if sender == ours)


async def test_admissions_resolve_the_default_without_a_round_trip_each(bluez: BluezController) -> None:
    provider, link = BleProvider(), bus_link()
    for _ in range(5):
        assert await provider.resolve_adapter(SCOPE) == "hci0"
    assert await _asked(bluez, link) == 1


async def test_the_default_follows_power_and_adapters_coming_and_going(bluez: BluezController) -> None:
    bluez.add_adapter("hci1")
    provider, link = BleProvider(), bus_link()
    assert await _default(provider, link) == "hci0"
    bluez.set_powered(False)
    assert await _default(provider, link) == "hci1"
    bluez.remove_adapter("hci1")
    assert await _default(provider, link) is None
    bluez.set_powered(True)
    assert await _default(provider, link) == "hci0"
    bluez.add_adapter("hci1")
    bluez.set_powered(False)
    assert await _default(provider, link) == "hci1"
    assert await _asked(bluez, link) == 1


async def test_a_restarted_bluetoothd_is_asked_again(bluez: BluezController) -> None:
    provider, link = BleProvider(), bus_link()
    assert await _default(provider, link) == "hci0"
    bluez.stop_bluetoothd()
    assert await _default(provider, link) is None  # nobody owns org.bluez: no adapter
    bluez.start_bluetoothd()
    bluez.add_adapter("hci1")
    assert await _default(provider, link) == "hci1"
    bluez.add_adapter("hci0")
    assert await _default(provider, link) == "hci0"
    assert await _asked(bluez, link) == 1  # of the new bluetoothd: it never saw the old one's call
