"""The BLE provider: each session runs bleak in a worker process of its own (`providers.ble_worker`).

Active scanning through BlueZ discovery. Passive scanning (advertisement monitors) is not used: it needs
or-patterns, cannot filter on service UUIDs and is still experimental in many BlueZ releases.

One worker per session makes every session its own BlueZ discovery client (its own D-Bus connection and
bleak manager), so sessions on one adapter run side by side: BlueZ merges their filters (src/adapter.c
`merge_discovery_filters`) and each worker re-filters. The filter always asks for every report
(`DuplicateData` and an RSSI floor), because bluetoothd otherwise signals RSSI only on 8 dB moves and
advertising data only on change (src/device.c `device_set_rssi_with_delta`, `device_set_manufacturer_data`).
It never carries `UUIDs` (CONTRACT §6.3): bluetoothd and the kernel match those on the advert's UUID lists
only (adapter.c and mgmt.c `is_filter_match`), while a scope's UUID also matches a service-data key, which
Device1 `UUIDs` holds (device.c `add_service_data`); the worker matches UUIDs, names and company ids.

A stop is acknowledged when the worker's bleak `stop()` returned (or BlueZ said this client holds no
session). Without that, the qualified proof of CONTRACT §6.7: kill and reap the worker, see its unique bus
name released (NameOwnerChanged to empty, on the connector's own connection), then one round trip to
`org.bluez` answered - bluetoothd handles the disconnect before that later call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import struct
import sys
from collections.abc import Callable
from typing import Any

from dbus_fast import BusType, Message, MessageType
from dbus_fast.aio import MessageBus
from dbus_fast.errors import DBusFastError

from connector.core.observations import BleObservation
from connector.core.scope import DiscoveryScope, backend_filter_hint
from connector.errors import Code, ProviderError, ProviderRestarted, ProviderUnavailable
from providers.base import (
    BaseSession,
    ObservationSink,
    ProviderCapabilities,
    ProviderSession,
    StartUnconfirmed,
    finish_cleanup,
)
from providers.ble_adapters import ADAPTER_RULES, OBJECT_MANAGER_IFACE, AdapterView
from providers.ble_worker import BLUEZ, DBUS, GO, STOP, config_frame

INTROSPECT_IFACE = "org.freedesktop.DBus.Introspectable"
_ADAPTER_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")
# BlueZ refuses an RSSI discovery filter outside this range (src/adapter.c `parse_rssi`).
_RSSI_FILTER_MIN, _RSSI_FILTER_MAX = -127, 20
_LEN = struct.Struct(">I")
# How long a worker may take from spawn to discovering; a slower one is a failed start.
_START_BOUND_S = 20.0
# After an acknowledged stop the worker exits on EOF; one that lingers is killed.
_EXIT_BOUND_S = 1.0
# Errors the bus daemon answers itself when nobody owns org.bluez: no bluetoothd, so no sessions either.
_NO_BLUETOOTHD = frozenset(
    {"org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner"}
)


def discovery_filters(scope: DiscoveryScope) -> dict[str, Any]:
    """The BlueZ discovery filter for `scope`: LE, every report, an RSSI floor (CONTRACT §6.3)."""
    floor = backend_filter_hint(scope).get("min_rssi_dbm")
    pushed: dict[str, Any] = {"Transport": "le", "DuplicateData": True}
    # An RSSI filter even without a floor: with one set, bluetoothd signals every report's RSSI.
    pushed["RSSI"] = (
        _RSSI_FILTER_MIN if floor is None else max(_RSSI_FILTER_MIN, min(floor, _RSSI_FILTER_MAX))
    )
    return pushed


def _method(dest: str, path: str, iface: str, member: str, sig: str = "", *args: Any) -> Message:
    return Message(
        destination=dest, path=path, interface=iface, member=member, signature=sig, body=list(args)
    )


class BusLink:
    """The connector's own system-bus connection: adapter lookup, worker name watch, round trips to BlueZ.

    It stays open for the event loop's life (one connect, not one per scan); a dead one reconnects.
    """

    def __init__(self) -> None:
        self._bus: MessageBus | None = None
        self._lock = asyncio.Lock()
        self._gone: dict[str, asyncio.Event] = {}
        # The NameOwnerChanged rules added per worker name (on which connection, how many): removed when the
        # session is forgotten, so that no rule outlives its session (dbus-daemon allows 512 per connection).
        self._rules: dict[str, tuple[MessageBus, int]] = {}
        # One start at a time per adapter: bluetoothd answers only the last of two starts whose kernel
        # commands overlap (adapter.c `start_discovery` overwrites `adapter->client`).
        self.starts: dict[str, asyncio.Lock] = {}
        # The last default seen: a bluetoothd that does not answer now still had this one powered first.
        self.last_default: str | None = None
        self._adapters = AdapterView()
        self._adapters_watched_on: MessageBus | None = None  # the connection holding ADAPTER_RULES

    def close(self) -> None:
        """Disconnect now."""
        bus, self._bus = self._bus, None
        if bus is None:
            return
        with contextlib.suppress(Exception):
            bus.disconnect()
        if not bus._loop.is_running():
            # No loop will see the disconnect: release the socket now, as bleak does for such a bus.
            with contextlib.suppress(Exception):
                bus._finalize(None)

    async def bus(self) -> MessageBus:
        """Connected, reconnecting once the old connection died."""
        async with self._lock:
            if self._bus is None or not self._bus.connected:
                bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
                bus.add_message_handler(self._on_message)
                self._bus = bus
                self._adapters.forget()
            return self._bus

    def _on_message(self, msg: Message) -> None:
        self._adapters.on_message(msg)
        if msg.message_type == MessageType.SIGNAL and msg.member == "NameOwnerChanged" and msg.body[2] == "":
            event = self._gone.get(msg.body[0])
            if event is not None:
                event.set()

    async def _call(self, msg: Message) -> Message:
        reply = await (await self.bus()).call(msg)
        assert reply is not None
        return reply

    async def watch_name(self, name: str) -> None:
        """Start watching a worker's unique name for its release (before anything could release it)."""
        event = self._gone.setdefault(name, asyncio.Event())
        bus = await self.bus()
        await self._call(_method(DBUS, "/org/freedesktop/DBus", DBUS, "AddMatch", "s", _name_rule(name)))
        held = self._rules.get(name)
        self._rules[name] = (bus, held[1] + 1 if held is not None and held[0] is bus else 1)
        reply = await self._call(_method(DBUS, "/org/freedesktop/DBus", DBUS, "NameHasOwner", "s", name))
        if reply.message_type != MessageType.ERROR and not reply.body[0]:
            event.set()

    async def name_gone(self, name: str) -> None:
        """Return once the bus daemon reported `name` released."""
        await self._gone.setdefault(name, asyncio.Event()).wait()

    def is_gone(self, name: str) -> bool:
        """True once the release of `name` was seen."""
        event = self._gone.get(name)
        return event is not None and event.is_set()

    def forget(self, name: str) -> None:
        """Stop tracking a name (its session is over) and remove its match rules from the bus."""
        self._gone.pop(name, None)
        bus, count = self._rules.pop(name, (None, 0))
        if bus is None or not bus.connected:
            return  # a closed connection took its rules with it
        for _ in range(count):
            bus.send(_method(DBUS, "/org/freedesktop/DBus", DBUS, "RemoveMatch", "s", _name_rule(name)))

    async def bluez_answers(self) -> bool:
        """One round trip to org.bluez; True when bluetoothd answered (or no bluetoothd runs at all)."""
        try:
            reply = await self._call(_method(BLUEZ, "/org/bluez", INTROSPECT_IFACE, "Introspect"))
        except (OSError, DBusFastError, EOFError):
            return False
        # An error counts only from bluetoothd itself, or the bus daemon saying nobody owns org.bluez.
        return (
            reply.message_type != MessageType.ERROR
            or reply.sender != DBUS
            or reply.error_name in _NO_BLUETOOTHD
        )

    async def default_adapter(self) -> str | None:
        """The first powered adapter in name order, or None: from bluetoothd's signals once it answered
        one GetManagedObjects (`providers.ble_adapters`), so an admission costs no round trip."""
        if not self._adapters.known:
            await self._ask_adapters()
        if self._adapters.known:
            self.last_default = self._adapters.default()
        return self.last_default

    async def _ask_adapters(self) -> None:
        bus = await self.bus()
        if self._adapters_watched_on is not bus:  # the rules first: no signal after the answer is lost
            for rule in ADAPTER_RULES:
                await self._call(_method(DBUS, "/org/freedesktop/DBus", DBUS, "AddMatch", "s", rule))
            self._adapters_watched_on = bus
        generation = self._adapters.begin()
        try:
            reply = await self._call(_method(BLUEZ, "/", OBJECT_MANAGER_IFACE, "GetManagedObjects"))
        except BaseException:  # cut off (the caller's bound) or the bus failed: nothing was learnt
            self._adapters.abandon()
            raise
        if reply.message_type == MessageType.ERROR:
            self._adapters.abandon()
            self.last_default = None
            return
        self.last_default = self._adapters.take(generation, reply.body[0])


def _name_rule(name: str) -> str:
    return f"type='signal',sender='{DBUS}',interface='{DBUS}',member='NameOwnerChanged',arg0='{name}'"


_links: dict[tuple[asyncio.AbstractEventLoop, str], BusLink] = {}


def bus_link() -> BusLink:
    """The connector's link for this event loop and system bus (like bleak's one manager per loop)."""
    loop = asyncio.get_running_loop()
    for key in [k for k in _links if k[0].is_closed()]:
        _links.pop(key).close()
    key = (loop, os.environ.get("DBUS_SYSTEM_BUS_ADDRESS", ""))
    link = _links.get(key)
    if link is None:
        link = _links[key] = BusLink()
    return link


def close_links() -> None:
    """Close every link (the end of the process, or of a test's event loop)."""
    while _links:
        _links.popitem()[1].close()


def _start_error(code: str, rule: str) -> ProviderError:
    diagnostics = [{"code": "ble-backend", "message": rule}]
    if code == Code.PROVIDER_UNAVAILABLE:
        if rule == "powered-off":
            return ProviderUnavailable("the BLE adapter is powered off")
        return ProviderUnavailable("the BLE adapter is not available", diagnostics=diagnostics)
    return ProviderError("BlueZ refused to start discovery", diagnostics=diagnostics)


class BleSession(BaseSession):
    """One BLE session: its worker process, the pipe to it, and its stop."""

    def __init__(
        self,
        scope: DiscoveryScope,
        sink: ObservationSink,
        adapter_path: str,
        link: BusLink,
        *,
        coalesce: bool = True,
        start_lock: asyncio.Lock | None = None,
    ) -> None:
        super().__init__(scope, sink)
        self._coalesce = coalesce
        self._start_lock = start_lock or asyncio.Lock()
        self._grant: asyncio.Task[None] | None = None
        self._adapter_path = adapter_path
        self._link = link
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stop_answer: asyncio.Future[str | None] | None = None
        self.unique_name: str | None = None
        self._exited = False
        self._early_failure: ProviderError | None = None

    @property
    def worker_pid(self) -> int | None:
        """The worker's process id (tests and benchmarks)."""
        return None if self._proc is None else self._proc.pid

    async def open(self) -> None:
        """Spawn the worker and wait until it is discovering; on any failure nothing is left behind."""
        config = {
            "adapter_path": self._adapter_path,
            "filters": discovery_filters(self.scope),
            "scope": self.scope,
            "coalesce": self._coalesce,
        }
        try:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "providers.ble_worker",
                str(os.getpid()),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
            )
            assert self._proc.stdin is not None
            self._proc.stdin.write(config_frame(config))
            self._reader = asyncio.ensure_future(self._read())
            async with asyncio.timeout(_START_BOUND_S):
                await asyncio.shield(self._started)
        except BaseException:
            if not await finish_cleanup(self._abandon()):
                raise StartUnconfirmed(
                    "the BLE discovery may have started and was not proven stopped", self
                ) from None
            raise
        self.opened()
        if self._early_failure is not None:  # reported between "ready" and this point
            self.fail(self._early_failure)

    async def _abandon(self) -> bool:
        """After a failed start: True when nothing is left (the worker never reached the bus, or proven)."""
        # EOF first: a worker cut off before its discovery started clears its pre-set filter and exits
        # (CONTRACT §6.5); one that lingers is killed.
        proc = self._proc
        if proc is not None and proc.stdin is not None and proc.returncode is None:
            proc.stdin.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_EXIT_BOUND_S):
                    await proc.wait()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_EXIT_BOUND_S):
                await self._kill()
        if not self._started.done():
            self._started.cancel()
        elif not self._started.cancelled():
            self._started.exception()  # the failure being raised already: nothing left to log it
        reaped = self._proc is None or self._proc.returncode is not None
        # Without a bus name reported (and drained from the pipe) the worker never asked BlueZ for anything.
        if (reaped and self.unique_name is None) or await self._bounded_proof():
            self._forget()
            return True
        return False

    async def _read(self) -> None:
        """Frames from the worker until it exits."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        stdout = proc.stdout
        try:
            while True:
                head = await stdout.readexactly(4)
                payload = await stdout.readexactly(_LEN.unpack(head)[0])
                await self._dispatch(payload)
        except (asyncio.IncompleteReadError, ConnectionError, OSError, DBusFastError, EOFError):
            pass  # the worker exited, or our own bus link failed: either way this session is over
        except Exception:
            # Fixed text only, and the exception is not kept: its text could quote a device address.
            self._failed(ProviderError("the BLE worker sent a frame that could not be handled"))
        finally:
            self._on_exit()

    async def _dispatch(self, payload: bytes) -> None:
        import marshal

        message = marshal.loads(payload)
        kind = message[0]
        if kind == "o":
            observe = self.deliver_prefiltered
            new = tuple.__new__
            for fields in message[1]:
                observe(new(BleObservation, fields))
        elif kind == "bus":
            self.unique_name = message[1]
            await self._link.watch_name(message[1])
            self._grant = asyncio.ensure_future(self._grant_start())
        elif kind == "ready":
            _resolve(self._started, None)
        elif kind == "error":
            if not self._started.done():
                self._started.set_exception(_start_error(message[1], message[2]))
        elif kind == "gone":
            self._failed(ProviderRestarted("the BLE adapter or bluetoothd went away during the session"))
        elif kind == "deaf":
            self._failed(ProviderError("the BLE adapter stopped discovering and could not be restarted"))
        elif kind == "stopped" and self._stop_answer is not None:
            _resolve(self._stop_answer, message[1])

    async def _grant_start(self) -> None:
        """Let the worker start discovery while it holds the adapter's start turn (until it is started)."""
        async with self._start_lock:
            proc = self._proc
            if self._started.done() or proc is None or proc.stdin is None or proc.stdin.is_closing():
                return
            try:
                proc.stdin.write(GO)
            except (ConnectionError, RuntimeError):
                return  # the worker is gone: its reader ends the start
            await asyncio.wait({self._started})

    def _on_exit(self) -> None:
        self._exited = True
        if not self._started.done():
            self._started.set_exception(ProviderError("the BLE worker exited while starting"))
        self._failed(ProviderError("the BLE worker exited during the session"))
        if self._stop_answer is not None:
            _resolve(self._stop_answer, "worker-exited")

    def _failed(self, error: ProviderError) -> None:
        if self.is_open:
            self.fail(error)
        elif self._started.done() and self._early_failure is None:
            self._early_failure = error

    async def _stop_backend(self) -> str | None:
        """Ask the worker to stop bleak; None once BlueZ acknowledged."""
        proc = self._proc
        if self._exited or proc is None or proc.stdin is None:
            return "worker-exited"
        self._stop_answer = asyncio.get_running_loop().create_future()
        try:
            proc.stdin.write(STOP)
        except (ConnectionError, RuntimeError):
            return "worker-exited"
        refusal = await self._stop_answer
        if refusal is None:
            await self._retire()
        return refusal

    async def _retire(self) -> None:
        """After an acknowledged stop: close the pipe (the worker exits on EOF) and reap it."""
        proc = self._proc
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            async with asyncio.timeout(_EXIT_BOUND_S):
                await proc.wait()
        except TimeoutError:
            await self._kill()
        self._forget()

    async def _prove_stopped(self) -> bool:
        """Kill and reap the worker, see its bus name released, then one answered round trip to BlueZ."""
        await self._kill()
        if self.unique_name is not None:
            if not self._link.is_gone(self.unique_name):
                # A reconnected link lost the match rule: watch again, and ask the bus whether it is gone.
                await self._link.watch_name(self.unique_name)
            await self._link.name_gone(self.unique_name)
        if not await self._link.bluez_answers():
            return False
        self._forget()
        return True

    async def _kill(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        await proc.wait()
        if self._reader is not None:
            await asyncio.wait({self._reader})

    def _forget(self) -> None:
        """The session is over: stop tracking its name."""
        if self.unique_name is not None:
            self._link.forget(self.unique_name)


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


class BleProvider:
    """BLE discovery through bleak on BlueZ, one worker process per session."""

    def __init__(
        self,
        adapter: str | None = None,
        *,
        every_report: bool = False,
        link: Callable[[], BusLink] = bus_link,
    ) -> None:
        self._adapter = adapter
        # A recording wants every report as it came; a scan only each device's latest per worker batch.
        self._every_report = every_report
        self._link = link
        self._capabilities = ProviderCapabilities(
            transport="ble",
            backend_filters=frozenset({"min_rssi_dbm"}),  # never UUIDs (CONTRACT §6.3)
            # Every session is a BlueZ discovery client of its own (CONTRACT §6.7).
            concurrent_sessions=True,
        )

    @property
    def capabilities(self) -> ProviderCapabilities:
        """Declared capabilities."""
        return self._capabilities

    async def resolve_adapter(self, scope: DiscoveryScope) -> str | None:
        """The adapter a scan of `scope` would use: named, else ours, else the first powered one."""
        name = scope.adapter or self._adapter
        if name is not None:
            return name
        link = self._link()
        try:
            async with asyncio.timeout(1.0):
                return await link.default_adapter()
        except (TimeoutError, OSError, DBusFastError, EOFError):
            return link.last_default

    async def start(self, scope: DiscoveryScope, sink: ObservationSink) -> ProviderSession:
        """Start one discovery session on the scope's adapter (else ours, else the first powered one)."""
        name = scope.adapter or self._adapter
        if name is not None and not _ADAPTER_NAME.fullmatch(name):
            raise ProviderUnavailable("the BLE adapter was not found")
        if name is None:
            name = await self.resolve_adapter(scope)
            if name is None:
                raise ProviderUnavailable("no powered BLE adapter is available")
        link = self._link()
        session = BleSession(
            scope,
            sink,
            f"/org/bluez/{name}",
            link,
            coalesce=not self._every_report,
            start_lock=link.starts.setdefault(name, asyncio.Lock()),
        )
        await session.open()
        return session
