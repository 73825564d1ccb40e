"""Simulated backends for mock-device CI (CONTRACT §13.1): devices and adapter faults scripted at run time.

One `SimulatedAdapter` per transport holds the devices a test put there, whether the adapter is powered,
and how the next stops answer. Its provider plugs into the same seam as replay and the real libraries, and
its sessions keep the real stacks' rules:
- BLE (modelled on BlueZ `src/adapter.c` discovery clients, as bleak's `BleakScannerBlueZDBus` sees them):
  an advertising device is an observation at every advertising interval (default 1000 ms) while the
  session runs; a device that stops advertising is simply no longer seen (the candidate TTL drops it);
- USB/serial (modelled on `providers/serial.py` `enumeration_pass` over pyserial's `comports()`): every
  attached device is seen again at each pass, at most 1 s apart; a removal is a `remove` at the next pass;
- mDNS (modelled on python-zeroconf's `ServiceBrowser` as `providers/mdns.py` drives it): a resolved
  instance is re-seen at each presence pass, at most 1 s apart; a removal is a goodbye (`remove`);
- every observation goes through the provider-side re-filter of `providers.base.BaseSession`, so nothing
  out of scope leaves the provider;
- an adapter powered off, or a backend restart, ends every running session with `provider-restarted`; a
  start on a powered-off adapter is `provider-unavailable`;
- a stop answers as the adapter's stop mode says at the time of the attempt: `ack` acknowledges, `refuse`
  refuses, `stall` never answers (the base's cleanup bound cuts it). The simulated backend has no qualified
  proof: after a refusal or a stall `BaseSession.stop` raises `StopUnconfirmed`, cleanup stays uncertain and
  the claim held until a later stop (a background retry) meets `ack`.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import anyio

from connector.contract.transports import TRANSPORTS, Transport
from connector.core.observations import BleObservation, MdnsObservation, Observation, UsbObservation
from connector.core.scope import DiscoveryScope
from connector.core.transports import TRANSPORT_FACTS
from connector.errors import Code, ProviderRestarted, ProviderUnavailable, SensoriumError
from connector.timer import WALL_TIMER, Timer
from providers.base import BaseSession, ObservationSink, ProviderCapabilities
from providers.replay import LineError, finish_task, parse_observation_line

StopMode = Literal["ack", "refuse", "stall"]
STOP_MODES: Final[tuple[StopMode, ...]] = ("ack", "refuse", "stall")
DEFAULT_INTERVAL_MS: Final = 1000
# Enumeration (USB) and presence (mDNS) passes of the real providers run at most this far apart.
PASS_INTERVAL_MS: Final = 1000
MIN_INTERVAL_MS: Final = 20
MAX_INTERVAL_MS: Final = 60_000
MAX_DEVICES: Final = 256


class SimulationRefused(SensoriumError):
    """A simulation request was refused; the message names paths and rules, never a value."""

    default_code = Code.INVALID_INPUT


def _refused(path: str, rule: str) -> SimulationRefused:
    return SimulationRefused(
        "the simulation request is invalid",
        code=Code.INVALID_INPUT,
        diagnostics=[{"code": Code.INVALID_INPUT, "message": f"{path}: {rule}" if path else rule}],
    )


# ---- devices ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class SimDevice:
    """One simulated device: its latest observation and how often a session sees it again."""

    sim_id: str
    identity: str
    observation: Observation
    interval_ms: int


def _identity(observation: Observation) -> str:
    """BLE address, USB device node, mDNS service type + name (CONTRACT §13.1)."""
    if isinstance(observation, BleObservation):
        return observation.address.upper()
    if isinstance(observation, UsbObservation):
        return observation.device
    return f"{observation.service_type.lower()}\x00{observation.name}"


def parse_device(transport: Transport, body: Any) -> tuple[Observation, int]:
    """A POSTed device (CONTRACT §13 line without `t_ms`; BLE may add `interval_ms`) as an observation."""
    if not isinstance(body, dict):
        raise _refused("", "not-an-object")
    doc = dict(body)
    if "t_ms" in doc:
        raise _refused("/t_ms", "not-allowed")
    interval = doc.pop("interval_ms", None)
    # Only an event-less transport (BLE: adverts repeat) has an advertising interval.
    events = TRANSPORT_FACTS[transport].events
    if interval is not None and events:
        raise _refused("/interval_ms", "ble-only")
    interval_ms = _interval(interval)
    if events:
        event = doc.setdefault("event", "add")
        if event not in ("add", "update"):
            raise _refused("/event", "add-or-update")
        if "update" not in events:
            doc["event"] = "add"
    doc["t_ms"] = 0
    try:
        _, observation = parse_observation_line(transport, json.dumps(doc))
    except LineError as error:
        raise _refused("", str(error)) from None
    return observation, interval_ms


def _interval(value: Any) -> int:
    if value is None:
        return DEFAULT_INTERVAL_MS
    if isinstance(value, bool) or not isinstance(value, int):
        raise _refused("/interval_ms", "not-an-integer")
    if not MIN_INTERVAL_MS <= value <= MAX_INTERVAL_MS:
        raise _refused("/interval_ms", f"range-{MIN_INTERVAL_MS}-{MAX_INTERVAL_MS}")
    return value


def _removal(observation: Observation) -> Observation | None:
    """What a session sees when a device leaves: a USB removal, an mDNS goodbye; BLE just goes quiet."""
    if isinstance(observation, UsbObservation):
        return UsbObservation(
            event="remove",
            device=observation.device,
            vid=observation.vid,
            pid=observation.pid,
            serial_number=observation.serial_number,
        )
    if isinstance(observation, MdnsObservation):
        return MdnsObservation(event="remove", service_type=observation.service_type, name=observation.name)
    return None


def _presence(observation: Observation) -> Observation:
    """The observation a later pass repeats (mDNS presence passes report `update`)."""
    if isinstance(observation, MdnsObservation) and observation.event == "add":
        return MdnsObservation(
            event="update",
            service_type=observation.service_type,
            name=observation.name,
            server=observation.server,
            addresses=observation.addresses,
            port=observation.port,
            txt=observation.txt,
            ttl=observation.ttl,
        )
    return observation


# ---- the stop gate ---------------------------------------------------------------------------------------


class StopGate:
    """Answers one stop attempt as the adapter's current mode says: acknowledge, refuse, or never answer."""

    def __init__(self) -> None:
        self.mode: StopMode = "ack"

    async def answer(self) -> str | None:
        """None (acknowledge), the refusing rule (refuse), or never (stall: the base's bound cuts it)."""
        mode = self.mode
        if mode == "refuse":
            return "simulated-stop-refused"
        if mode == "stall":
            await anyio.sleep_forever()
        return None


# ---- one session -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Schedule:
    """When a session next sees each device (ms on the session's timer)."""

    due: dict[str, int] = field(default_factory=dict)


class SimulatedSession(BaseSession):
    """One session on a simulated adapter: a player task behind the base's gate, re-filter and stop bound."""

    # Each stop is a fresh attempt: a stalled one is dropped, so a later `{"stop": "ack"}` can confirm.
    rejoin_stalled_attempt = False

    def __init__(self, adapter: SimulatedAdapter, scope: DiscoveryScope, sink: ObservationSink) -> None:
        super().__init__(scope, sink, adapter.timer)
        self._adapter = adapter
        self._schedule = _Schedule()
        self._wake = anyio.Event()
        now_ms = self._timer.now_ms()
        for device in adapter.devices.values():
            self._schedule.due[device.sim_id] = now_ms
        self.opened()
        self._task = asyncio.get_running_loop().create_task(self._play())

    async def _play(self) -> None:
        """See every due device, then sleep until the next one is due or the adapter changes."""
        timer = self._timer
        while True:
            now_ms = timer.now_ms()
            for sim_id, due_ms in list(self._schedule.due.items()):
                device = self._adapter.devices.get(sim_id)
                if device is None:
                    del self._schedule.due[sim_id]
                elif due_ms <= now_ms:
                    self.deliver(_presence(device.observation))
                    self._schedule.due[sim_id] = now_ms + device.interval_ms
            self._wake = anyio.Event()
            with timer.scope_until(min(self._schedule.due.values(), default=now_ms + 3_600_000)):
                await self._wake.wait()

    def device_changed(self, device: SimDevice) -> None:
        """A device appeared or updated: seen at once (a new advert / the next pass answers it)."""
        self._schedule.due[device.sim_id] = 0
        self._wake.set()

    def device_left(self, device: SimDevice) -> None:
        """A device left: USB removal / mDNS goodbye now; BLE stops advertising."""
        self._schedule.due.pop(device.sim_id, None)
        removal = _removal(device.observation)
        if removal is not None:
            self.deliver(removal)

    def lose_backend(self, error: ProviderRestarted) -> None:
        """The adapter went away under this session: play no more, report once (the base closes the gate)."""
        self._task.cancel()
        self.fail(error)

    async def _stop_backend(self) -> str | None:
        """One stop attempt through the gate; on acknowledgement the player has finished."""
        refusal = await self._adapter.gate.answer()
        if refusal is not None:
            return refusal
        await finish_task(self._task)
        self._adapter.forget(self)
        return None


# ---- one adapter -----------------------------------------------------------------------------------------


class SimulatedAdapter:
    """The simulated backend of one transport."""

    def __init__(self, transport: Transport, new_id: Callable[[], str], timer: Timer = WALL_TIMER) -> None:
        self.transport: Transport = transport
        self.timer = timer
        self.powered = True
        self.gate = StopGate()
        self.devices: dict[str, SimDevice] = {}
        self._by_identity: dict[str, str] = {}
        self._sessions: set[SimulatedSession] = set()
        self._new_id = new_id

    @property
    def session_count(self) -> int:
        """Sessions started and not yet acknowledged as stopped."""
        return len(self._sessions)

    def start(self, scope: DiscoveryScope, sink: ObservationSink) -> SimulatedSession:
        """A new session; `provider-unavailable` while powered off."""
        if not self.powered:
            raise ProviderUnavailable("the simulated adapter is powered off")
        session = SimulatedSession(self, scope, sink)
        self._sessions.add(session)
        return session

    def forget(self, session: SimulatedSession) -> None:
        """A session's stop was acknowledged."""
        self._sessions.discard(session)

    def put(self, observation: Observation, interval_ms: int) -> tuple[str, bool]:
        """Add or update a device by identity; returns (sim/id, created)."""
        identity = _identity(observation)
        known = self._by_identity.get(identity)
        if known is None and len(self.devices) >= MAX_DEVICES:
            raise _refused("", f"at-most-{MAX_DEVICES}-devices")
        sim_id = known or self._new_id()
        device = SimDevice(sim_id, identity, observation, interval_ms)
        self.devices[sim_id] = device
        self._by_identity[identity] = sim_id
        for session in list(self._sessions):
            session.device_changed(device)
        return sim_id, known is None

    def remove(self, sim_id: str) -> bool:
        """A device leaves; False when there is no such device."""
        device = self.devices.pop(sim_id, None)
        if device is None:
            return False
        self._by_identity.pop(device.identity, None)
        for session in list(self._sessions):
            session.device_left(device)
        return True

    def set_powered(self, powered: bool) -> None:
        """Power off ends every running session `provider-restarted`; power on lets new ones start."""
        self.powered = powered
        if not powered:
            self._fail_all("the simulated adapter was powered off")

    def restart(self) -> None:
        """The backend restarts: running sessions end `provider-restarted`."""
        self._fail_all("the simulated backend restarted")

    def _fail_all(self, message: str) -> None:
        for session in list(self._sessions):
            session.lose_backend(ProviderRestarted(message))

    def describe(self) -> dict[str, Any]:
        """The adapter's state as the simulation routes answer it (no device data)."""
        return {
            "transport": self.transport,
            "powered": self.powered,
            "stop": self.gate.mode,
            "devices": len(self.devices),
            "sessions": len(self._sessions),
        }


class SimulatedProvider:
    """The provider seam over one simulated adapter."""

    def __init__(self, adapter: SimulatedAdapter) -> None:
        self._adapter = adapter
        # Every real provider shares its adapter between sessions (a claim held by an uncertain cleanup
        # still blocks new ones), so the simulated ones do too.
        self._capabilities = ProviderCapabilities(transport=adapter.transport, concurrent_sessions=True)

    @property
    def capabilities(self) -> ProviderCapabilities:
        """Declared capabilities: the real provider's sharing, no backend-side filters (all re-filtered)."""
        return self._capabilities

    async def start(self, scope: DiscoveryScope, sink: ObservationSink) -> SimulatedSession:
        """Start a session on the adapter."""
        if scope.transport != self._adapter.transport:
            raise ProviderUnavailable("the simulated adapter is for another transport")
        return self._adapter.start(scope, sink)


class Simulation:
    """Every simulated transport of one process, driven by the `/v1/sim/...` routes."""

    def __init__(self, transports: tuple[Transport, ...] = TRANSPORTS, timer: Timer = WALL_TIMER) -> None:
        self.adapters: dict[str, SimulatedAdapter] = {
            transport: SimulatedAdapter(transport, _new_sim_id, timer) for transport in transports
        }

    @property
    def transports(self) -> tuple[str, ...]:
        """The simulated transports."""
        return tuple(self.adapters)

    def adapter(self, transport: str) -> SimulatedAdapter | None:
        """The simulated adapter of `transport`, if it is simulated."""
        return self.adapters.get(transport)

    def provider(self, transport: str) -> SimulatedProvider | None:
        """The provider of a simulated transport."""
        adapter = self.adapters.get(transport)
        return None if adapter is None else SimulatedProvider(adapter)


def adapter_command(adapter: SimulatedAdapter, body: Any) -> dict[str, Any]:
    """Apply one `POST /v1/sim/{transport}/adapter` body: exactly one of powered, restart, stop."""
    if not isinstance(body, Mapping) or len(body) != 1:
        raise _refused("", "exactly-one-of-powered-restart-stop")
    ((key, value),) = body.items()
    if key == "powered":
        if not isinstance(value, bool):
            raise _refused("/powered", "not-a-boolean")
        adapter.set_powered(value)
    elif key == "restart":
        if value is not True:
            raise _refused("/restart", "must-be-true")
        adapter.restart()
    elif key == "stop":
        if value not in STOP_MODES:
            raise _refused("/stop", "ack-refuse-or-stall")
        adapter.gate.mode = value
    else:
        raise _refused("", "exactly-one-of-powered-restart-stop")
    return adapter.describe()


def parse_simulate(text: str | None) -> tuple[Transport, ...]:
    """`--simulate` values: bare (all three) or `T[,T...]`; ValueError naming what is allowed."""
    if text is None or text == "all":
        return TRANSPORTS
    chosen: list[Transport] = []
    for part in (p.strip() for p in text.split(",")):
        match = next((t for t in TRANSPORTS if t == part), None)
        if match is None:
            raise ValueError("--simulate takes a comma-separated list of ble, usb-serial, mdns (or nothing)")
        if match not in chosen:
            chosen.append(match)
    return tuple(chosen)


def _new_sim_id() -> str:
    return "sim-" + secrets.token_hex(8)
