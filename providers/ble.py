"""The BLE provider: bleak's BlueZ scanner behind the provider seam.

Active scanning through BlueZ discovery, with the scope's service UUIDs and RSSI floor pushed down as
discovery filters. Passive scanning (advertisement monitors) is not used: it needs or-patterns, cannot
filter on service UUIDs and is still experimental in many BlueZ releases.

BlueZ keeps one discovery session per D-Bus client; the acknowledgement of a stop is bleak's `stop()`
returning, or BlueZ telling us later that this client holds no session any more. bleak reports neither
adapter power nor removal to a scanner, so each session watches them on its own D-Bus connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

from bleak import BleakScanner
from bleak.args.bluez import BlueZDiscoveryFilters
from bleak.backends.bluezdbus.manager import get_global_bluez_manager
from bleak.backends.device import BLEDevice
from bleak.backends.scanner import AdvertisementData
from bleak.exc import BleakBluetoothNotAvailableError, BleakDBusError, BleakError
from dbus_fast import BusType, Message, MessageType
from dbus_fast.aio import MessageBus
from dbus_fast.errors import DBusFastError

from connector.core.observations import BleObservation
from connector.core.scope import DiscoveryScope, backend_filter_hint, scope_matcher
from connector.errors import ProviderError, ProviderRestarted, ProviderUnavailable, StopUnconfirmed
from providers.base import ObservationSink, ProviderCapabilities, ProviderSession

BLUEZ = "org.bluez"
DBUS = "org.freedesktop.DBus"
ADAPTER_IFACE = "org.bluez.Adapter1"
PROPERTIES_IFACE = "org.freedesktop.DBus.Properties"
OBJECT_MANAGER_IFACE = "org.freedesktop.DBus.ObjectManager"

_ADAPTER_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")
# BlueZ refuses an RSSI discovery filter outside this range.
_RSSI_FILTER_MIN, _RSSI_FILTER_MAX = -127, 20

# D-Bus errors meaning the adapter is off (NotReady) or gone (UnknownObject), or bluetoothd is not running.
# At start they make the provider unavailable. Answered to StopDiscovery they mean that BlueZ holds no
# discovery session of ours (bleak treats NotReady the same; a daemon's sessions die with it).
_UNAVAILABLE_ERRORS = frozenset(
    {
        "org.bluez.Error.NotReady",
        "org.freedesktop.DBus.Error.UnknownObject",
        "org.freedesktop.DBus.Error.ServiceUnknown",
        "org.freedesktop.DBus.Error.NameHasNoOwner",
    }
)
# bluetoothd's answer (org.bluez.Error.Failed) when this D-Bus client has no discovery session.
_NO_SESSION_TEXT = "No discovery started"


def _diagnostic(rule: str) -> list[dict[str, str]]:
    return [{"code": "ble-backend", "message": rule}]


def _guard_backend_logs() -> None:
    """bleak logs whole D-Bus signal bodies (addresses, names) at DEBUG: keep that away from any handler."""
    log = logging.getLogger("bleak")
    if log.getEffectiveLevel() < logging.INFO:
        log.setLevel(logging.INFO)


def discovery_filters(scope: DiscoveryScope) -> BlueZDiscoveryFilters:
    """The BlueZ discovery filter for `scope`: a superset prefilter, the provider re-filters every advert."""
    hint = backend_filter_hint(scope)
    pushed: BlueZDiscoveryFilters = {}
    if hint.get("service_uuids"):
        pushed["UUIDs"] = list(hint["service_uuids"])
    floor = hint.get("min_rssi_dbm")
    if floor is not None and floor >= _RSSI_FILTER_MIN:
        pushed["RSSI"] = min(floor, _RSSI_FILTER_MAX)
    return pushed


def to_observation(address: str, adv: AdvertisementData) -> BleObservation:
    """bleak's advert as a frozen observation (bleak builds fresh payload dicts for every advert)."""
    # Positional on purpose: keywords make this, the provider's costliest line, about a third slower.
    return BleObservation(
        address,
        adv.rssi,
        adv.local_name,
        tuple(adv.service_uuids),
        adv.manufacturer_data,
        adv.service_data,
        adv.tx_power,
    )


def _session_gone(error_name: str | None, details: str | None) -> bool:
    if error_name in _UNAVAILABLE_ERRORS:
        return True
    return error_name == "org.bluez.Error.Failed" and details == _NO_SESSION_TEXT


@contextlib.contextmanager
def _start_errors() -> Iterator[None]:
    """Translate bleak and D-Bus failures at start into provider errors (no driver text, no values)."""
    try:
        yield
    except ProviderError:
        raise
    except BleakBluetoothNotAvailableError:
        raise ProviderUnavailable("no powered BLE adapter is available") from None
    except BleakDBusError as exc:
        rule = _diagnostic(exc.dbus_error)
        if exc.dbus_error in _UNAVAILABLE_ERRORS:
            raise ProviderUnavailable("the BLE adapter is not ready", diagnostics=rule) from None
        raise ProviderError("BlueZ refused to start discovery", diagnostics=rule) from None
    except BleakError:
        raise ProviderUnavailable("the BLE adapter was not found") from None
    except (OSError, DBusFastError):
        raise ProviderUnavailable("the system bus or bluetoothd is unreachable") from None


def _method(dest: str, path: str, iface: str, member: str, sig: str = "", *args: Any) -> Message:
    body = list(args)
    return Message(destination=dest, path=path, interface=iface, member=member, signature=sig, body=body)


async def _disconnected(bus: MessageBus) -> None:
    await bus.wait_for_disconnect()  # type: ignore[no-untyped-call]


class _AdapterWatch:
    """Our own D-Bus connection watching the adapter's power, its removal and bluetoothd's bus name."""

    def __init__(self, adapter_path: str, on_gone: Callable[[], None]) -> None:
        self._path = adapter_path
        self._on_gone = on_gone
        self._bus: MessageBus | None = None
        self._disconnect_task: asyncio.Future[Any] | None = None
        self._closed = False
        self.gone = False

    def _rules(self) -> tuple[str, ...]:
        return (
            f"type='signal',sender='{BLUEZ}',interface='{PROPERTIES_IFACE}',member='PropertiesChanged',"
            f"path='{self._path}',arg0='{ADAPTER_IFACE}'",
            f"type='signal',sender='{BLUEZ}',interface='{OBJECT_MANAGER_IFACE}',member='InterfacesRemoved',"
            f"arg0path='{self._path}'",
            f"type='signal',sender='{DBUS}',interface='{DBUS}',member='NameOwnerChanged',arg0='{BLUEZ}'",
        )

    async def open(self) -> None:
        """Connect, subscribe, then check that the adapter exists and is powered."""
        try:
            with _start_errors():
                self._bus = bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
                bus.add_message_handler(self._on_message)
                for rule in self._rules():
                    await self._call(_method(DBUS, "/org/freedesktop/DBus", DBUS, "AddMatch", "s", rule))
                powered = await self._powered()
            if not powered:
                raise ProviderUnavailable("the BLE adapter is powered off")
            self._disconnect_task = asyncio.ensure_future(_disconnected(bus))
            self._disconnect_task.add_done_callback(self._on_disconnect)
        except BaseException:
            await self.close()
            raise

    async def _call(self, msg: Message) -> Message:
        assert self._bus is not None
        reply = await self._bus.call(msg)
        if reply is None or reply.message_type == MessageType.ERROR:
            rule = _diagnostic((reply.error_name if reply is not None else None) or "no-reply")
            raise ProviderUnavailable("the BLE adapter was not found", diagnostics=rule)
        return reply

    async def _powered(self) -> bool:
        get = _method(BLUEZ, self._path, PROPERTIES_IFACE, "Get", "ss", ADAPTER_IFACE, "Powered")
        reply = await self._call(get)
        return bool(reply.body[0].value)

    def _on_message(self, msg: Message) -> None:
        if msg.message_type == MessageType.SIGNAL and self._is_gone_signal(msg):
            self._fire()

    def _is_gone_signal(self, msg: Message) -> bool:
        if msg.member == "PropertiesChanged":
            powered = msg.body[1].get("Powered") if msg.path == self._path else None
            return powered is not None and not powered.value
        if msg.member == "InterfacesRemoved":
            return bool(msg.body[0] == self._path and ADAPTER_IFACE in msg.body[1])
        return bool(msg.member == "NameOwnerChanged" and msg.body[0] == BLUEZ)

    def _on_disconnect(self, task: asyncio.Future[Any]) -> None:
        if not task.cancelled():
            task.exception()  # retrieved on purpose: a lost system bus is reported through _fire()
        self._fire()

    def _fire(self) -> None:
        if not self._closed:
            self._closed = self.gone = True
            self._on_gone()

    async def close(self) -> None:
        """Disconnect; idempotent and quick (no round trip to BlueZ)."""
        self._closed = True
        bus, self._bus = self._bus, None
        if bus is None:
            return
        bus.disconnect()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(_disconnected(bus), 1.0)


class BleSession:
    """One BlueZ discovery session of one scope."""

    def __init__(self, scope: DiscoveryScope, sink: ObservationSink, adapter_path: str) -> None:
        self._scope = scope
        # The same rule as `matches_scope`, compiled once: it runs for every advert.
        self._in_scope = scope_matcher(scope)
        self._sink = sink
        self._adapter_path = adapter_path
        self._watch = _AdapterWatch(adapter_path, self._on_backend_gone)
        self._scanner = BleakScanner(
            self._on_advert,
            bluez={"adapter": adapter_path.rsplit("/", 1)[1], "filters": discovery_filters(scope)},
        )
        self._owner_bus: MessageBus | None = None
        self._active = False
        self._bleak_stop_called = False
        self._attempt: asyncio.Future[str | None] | None = None
        self._confirmed = False

    async def open(self) -> None:
        """Watch the adapter, then start bleak's scanner on it."""
        await self._watch.open()
        try:
            with _start_errors():
                await self._scanner.start()
                # The connection that owns our BlueZ discovery session (bleak keeps one per event loop).
                self._owner_bus = (await get_global_bluez_manager())._bus
        except BaseException:
            await self._watch.close()
            raise
        self._active = True
        if self._watch.gone:  # it went away while bleak was starting
            self._on_backend_gone()

    def _on_advert(self, device: BLEDevice, adv: AdvertisementData) -> None:
        if self._active:
            observation = to_observation(device.address, adv)
            if self._in_scope(observation):
                self._sink.observe(observation)

    def _on_backend_gone(self) -> None:
        if self._active:
            self._active = False
            self._sink.fail(ProviderRestarted("the BLE adapter or bluetoothd went away during the session"))

    async def stop(self) -> None:
        """Stop discovery; return once BlueZ acknowledged, else raise `StopUnconfirmed`. Idempotent."""
        if self._confirmed:
            return
        self._active = False
        if self._needs_attempt():
            self._attempt = asyncio.ensure_future(self._stop_backend())
        attempt = self._attempt
        assert attempt is not None
        try:
            async with asyncio.timeout(self._scope.cleanup_timeout_ms / 1000):
                await self._watch.close()
                # Shielded: a stalled attempt keeps waiting for BlueZ, and the next stop() joins it.
                refusal = await asyncio.shield(attempt)
        except TimeoutError:
            raise StopUnconfirmed("BlueZ did not acknowledge the stop within the cleanup bound") from None
        if refusal is not None:
            raise StopUnconfirmed("BlueZ refused to stop discovery", diagnostics=_diagnostic(refusal))
        self._confirmed = True

    def _needs_attempt(self) -> bool:
        attempt = self._attempt
        if attempt is None:
            return True
        return attempt.done() and (attempt.cancelled() or attempt.result() is not None)

    async def _stop_backend(self) -> str | None:
        """One stop attempt; None when acknowledged, else the rule that refused (a D-Bus error name)."""
        try:
            if self._bleak_stop_called:
                await self._retry_stop_discovery()
            else:
                self._bleak_stop_called = True
                await self._scanner.stop()
        except BleakDBusError as exc:
            return None if _session_gone(exc.dbus_error, exc.dbus_error_details) else exc.dbus_error
        except Exception:
            return None if self._owner_gone() else "backend-error"
        return None

    async def _retry_stop_discovery(self) -> None:
        """StopDiscovery again on the connection that owns the session (bleak's stop() cannot be re-run)."""
        bus = self._owner_bus
        if bus is None or not bus.connected:
            return  # BlueZ drops a client's discovery session when its connection closes
        reply = await bus.call(_method(BLUEZ, self._adapter_path, ADAPTER_IFACE, "StopDiscovery"))
        if reply is not None and reply.message_type == MessageType.ERROR:
            raise BleakDBusError(reply.error_name or "", reply.body)

    def _owner_gone(self) -> bool:
        return self._owner_bus is not None and not self._owner_bus.connected


class BleProvider:
    """BLE discovery through bleak on BlueZ."""

    def __init__(self, adapter: str | None = None) -> None:
        self._adapter = adapter
        self._capabilities = ProviderCapabilities(
            transport="ble",
            backend_filters=frozenset({"service_uuids", "min_rssi_dbm"}),
            # BlueZ serves several discovery clients at once; still, the (ble, adapter) claim stays exclusive.
            concurrent_sessions=False,
        )
        _guard_backend_logs()

    @property
    def capabilities(self) -> ProviderCapabilities:
        """Declared capabilities."""
        return self._capabilities

    async def start(self, scope: DiscoveryScope, sink: ObservationSink) -> ProviderSession:
        """Start one discovery session on the scope's adapter (else ours, else bleak's default)."""
        session = BleSession(scope, sink, await self._adapter_path(scope.adapter or self._adapter))
        await session.open()
        return session

    async def _adapter_path(self, name: str | None) -> str:
        if name is None:
            with _start_errors():
                return (await get_global_bluez_manager()).get_default_adapter()
        if not _ADAPTER_NAME.fullmatch(name):
            raise ProviderUnavailable("the BLE adapter was not found")
        return f"/org/bluez/{name}"
