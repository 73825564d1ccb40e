"""The replay backend: plays an `hw-fixtures/` file (CONTRACT §13) through the seam and filters real providers
use.

Each session plays the file from its first line, starting when the session starts, at recorded timing
divided by `speed`; after the last line it stays quiet (no loop, no failure) until it is stopped.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from connector.contract.transports import TRANSPORTS, Transport
from connector.core.observations import BleObservation, MdnsObservation, Observation, UsbObservation
from connector.core.scope import DiscoveryScope, expand_uuid
from connector.errors import ProviderUnavailable
from connector.timer import WALL_TIMER, Timer
from providers.base import BaseSession, ObservationSink, ProviderCapabilities, finish_cleanup

FIXTURE_FORMAT = "sensorium-hw-fixture.v1"
SOURCES = frozenset({"recorded", "synthesised"})
# Yield to the event loop after this many back-to-back due lines, so a sped-up replay never starves it.
_YIELD_EVERY = 256

Timeline = tuple[tuple[int, Observation], ...]


class FixtureError(ProviderUnavailable):
    """A fixture file (or replay setting) was refused; the message names a line and rule, never content."""


class _LineError(Exception):
    """A rule broken inside one line, with its JSON path; turned into a FixtureError with the line number."""

    def __init__(self, path: str, rule: str) -> None:
        super().__init__(f"{path}: {rule}" if path else rule)


@dataclass(frozen=True, slots=True)
class Fixture:
    """A parsed fixture: its header facts and its timeline of (t_ms, observation)."""

    transport: Transport
    source: str
    timeline: Timeline


# ---- parsing ---------------------------------------------------------------------------------------------


def load_fixture(path: Path | str) -> Fixture:
    """Read and validate a fixture file; raise FixtureError naming the first failing line and rule."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise FixtureError("replay fixture unreadable") from error
    return parse_fixture(text.splitlines())


def parse_fixture(lines: Sequence[str]) -> Fixture:
    """Validate the header and every observation line of a fixture."""
    rows = [(number, line) for number, line in enumerate(lines, start=1) if line.strip()]
    if not rows:
        raise FixtureError("replay fixture malformed: line 1: missing-header")
    transport, source = _checked(rows[0][0], _parse_header, rows[0][1])
    parse_line = _LINE_PARSERS[transport]
    timeline: list[tuple[int, Observation]] = []
    previous = 0
    for number, line in rows[1:]:
        t_ms, observation = _checked(number, parse_line, line)
        if t_ms < previous:
            raise FixtureError(f"replay fixture malformed: line {number}: /t_ms: not-monotonic")
        previous = t_ms
        timeline.append((t_ms, observation))
    return Fixture(transport=transport, source=source, timeline=tuple(timeline))


def _checked(number: int, parse: Callable[[str], Any], line: str) -> Any:
    """Run one line parser, mapping its failure to a FixtureError that names only the line and rule."""
    try:
        return parse(line)
    except _LineError as error:
        raise FixtureError(f"replay fixture malformed: line {number}: {error}") from None


def _object(line: str) -> dict[str, Any]:
    """One JSON object per line."""
    try:
        value = json.loads(line)
    except ValueError:
        raise _LineError("", "invalid-json") from None
    if not isinstance(value, dict):
        raise _LineError("", "not-an-object")
    return value


def _parse_header(line: str) -> tuple[Transport, str]:
    """The header line: format, transport and source are required, the rest typed when present."""
    header = _object(line)
    if header.get("fixture") != FIXTURE_FORMAT:
        raise _LineError("/fixture", "unknown-format")
    transport = header.get("transport")
    if transport not in TRANSPORTS:
        raise _LineError("/transport", "unknown-transport")
    if header.get("source") not in SOURCES:
        raise _LineError("/source", "unknown-source")
    for key in ("recorded_at", "notes"):
        _optional(header, key, str)
    if header.get("adapter") is not None:
        _optional(header, "adapter", str)
    _optional(header, "versions", dict)
    return transport, header["source"]


def _optional(doc: Mapping[str, Any], key: str, kind: type) -> Any:
    """A value that is absent or of `kind` (bools are not integers here)."""
    value = doc.get(key)
    if value is None:
        if key in doc:
            raise _LineError(f"/{key}", "null")
        return None
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise _LineError(f"/{key}", "not-an-integer")
    if not isinstance(value, kind):
        raise _LineError(f"/{key}", f"not-a-{_KIND_NAMES[kind]}")
    return value


def _required(doc: Mapping[str, Any], key: str, kind: type) -> Any:
    """A value that must be present and of `kind`."""
    if key not in doc:
        raise _LineError(f"/{key}", "required")
    return _optional(doc, key, kind)


_KIND_NAMES: Mapping[type, str] = {
    str: "string",
    int: "integer",
    bool: "boolean",
    dict: "object",
    list: "array",
}


_KEY_SHAPE = re.compile(r"[a-z_][a-z0-9_]{0,63}")


def _closed(doc: Mapping[str, Any], allowed: frozenset[str]) -> None:
    """Refuse keys the contract does not define for this line, naming the first when it has the shape of a
    key (a misspelt `rssi_dbm`); other key text is file content and never shown."""
    unknown = sorted(key for key in doc if key not in allowed)
    if unknown:
        named = next((key for key in unknown if _KEY_SHAPE.fullmatch(key)), None)
        raise _LineError("" if named is None else f"/{named}", "unknown-key")


def _ranged(value: int | None, key: str, low: int, high: int) -> int | None:
    """An optional integer within [low, high]."""
    if value is not None and not low <= value <= high:
        raise _LineError(f"/{key}", "out-of-range")
    return value


def _t_ms(doc: Mapping[str, Any]) -> int:
    """The offset of a line from the start of the session."""
    t_ms: int = _required(doc, "t_ms", int)
    if t_ms < 0:
        raise _LineError("/t_ms", "out-of-range")
    return t_ms


def _strings(doc: Mapping[str, Any], key: str) -> tuple[str, ...]:
    """An optional list of strings."""
    values = _optional(doc, key, list) or []
    if not all(isinstance(value, str) for value in values):
        raise _LineError(f"/{key}", "not-a-string-list")
    return tuple(values)


def _hex_map(doc: Mapping[str, Any], key: str) -> dict[str, bytes]:
    """An optional object of hex payloads."""
    values = _optional(doc, key, dict) or {}
    try:
        return {name: bytes.fromhex(payload) for name, payload in values.items()}
    except (TypeError, ValueError):
        raise _LineError(f"/{key}", "not-hex") from None


_BLE_KEYS = frozenset(
    {
        "t_ms",
        "address",
        "name",
        "rssi",
        "service_uuids",
        "manufacturer_data",
        "service_data",
        "tx_power",
        "connectable",
    }
)
_USB_KEYS = frozenset(
    {
        "t_ms",
        "event",
        "device",
        "vid",
        "pid",
        "serial_number",
        "manufacturer",
        "product",
        "location",
        "interface",
    }
)
_MDNS_KEYS = frozenset({"t_ms", "event", "service_type", "name", "server", "addresses", "port", "txt", "ttl"})


def _uuid(text: str) -> str:
    """A UUID in the one form filters use (CONTRACT §6.1): `180d` is the 128-bit Heart Rate UUID."""
    return expand_uuid(text) or text.lower()


def _ble_line(line: str) -> tuple[int, Observation]:
    """A BLE advertisement line."""
    doc = _object(line)
    _closed(doc, _BLE_KEYS)
    rssi: int = _required(doc, "rssi", int)
    _ranged(rssi, "rssi", -127, 20)
    return _t_ms(doc), BleObservation(
        address=_required(doc, "address", str),
        rssi=rssi,
        name=_optional(doc, "name", str),
        service_uuids=tuple(_uuid(uuid) for uuid in _strings(doc, "service_uuids")),
        manufacturer_data=_company_map(doc),
        service_data={_uuid(uuid): data for uuid, data in _hex_map(doc, "service_data").items()},
        tx_power=_ranged(_optional(doc, "tx_power", int), "tx_power", -127, 127),
        connectable=_optional(doc, "connectable", bool),
    )


def _company_map(doc: Mapping[str, Any]) -> dict[int, bytes]:
    """`manufacturer_data` keyed by decimal company ids (0..65535)."""
    payloads = _hex_map(doc, "manufacturer_data")
    if not all(company.isdigit() and int(company) <= 0xFFFF for company in payloads):
        raise _LineError("/manufacturer_data", "not-a-company-id")
    return {int(company): data for company, data in payloads.items()}


def _usb_line(line: str) -> tuple[int, Observation]:
    """A serial port add/remove line."""
    doc = _object(line)
    _closed(doc, _USB_KEYS)
    event = _required(doc, "event", str)
    if event not in ("add", "remove"):
        raise _LineError("/event", "unknown-event")
    return _t_ms(doc), UsbObservation(
        event=event,
        device=_required(doc, "device", str),
        vid=_ranged(_optional(doc, "vid", int), "vid", 0, 0xFFFF),
        pid=_ranged(_optional(doc, "pid", int), "pid", 0, 0xFFFF),
        serial_number=_optional(doc, "serial_number", str),
        manufacturer=_optional(doc, "manufacturer", str),
        product=_optional(doc, "product", str),
        location=_optional(doc, "location", str),
        interface=_optional(doc, "interface", str),
    )


def _mdns_line(line: str) -> tuple[int, Observation]:
    """An mDNS add/update/remove line."""
    doc = _object(line)
    _closed(doc, _MDNS_KEYS)
    event = _required(doc, "event", str)
    if event not in ("add", "update", "remove"):
        raise _LineError("/event", "unknown-event")
    txt = _optional(doc, "txt", dict) or {}
    if not all(isinstance(value, str) for value in txt.values()):
        raise _LineError("/txt", "not-a-string-map")
    return _t_ms(doc), MdnsObservation(
        event=event,
        service_type=_required(doc, "service_type", str),
        name=_required(doc, "name", str),
        server=_optional(doc, "server", str),
        addresses=_strings(doc, "addresses"),
        port=_ranged(_optional(doc, "port", int), "port", 0, 0xFFFF),
        txt=dict(txt),
        ttl=_ranged(_optional(doc, "ttl", int), "ttl", 0, 2**31 - 1),
    )


_LINE_PARSERS: Mapping[str, Callable[[str], tuple[int, Observation]]] = {
    "ble": _ble_line,
    "usb-serial": _usb_line,
    "mdns": _mdns_line,
}


def parse_observation_line(transport: Transport, line: str) -> tuple[int, Observation]:
    """One observation line of `transport` by the fixture rules; `LineError` names the path and rule."""
    return _LINE_PARSERS[transport](line)


LineError = _LineError


# ---- playing ---------------------------------------------------------------------------------------------


def check_speed(speed: float) -> float:
    """A replay speed must be a positive finite number."""
    if (
        isinstance(speed, bool)
        or not isinstance(speed, int | float)
        or not math.isfinite(speed)
        or speed <= 0
    ):
        raise FixtureError("replay speed must be a positive finite number")
    return float(speed)


async def play_timeline(
    timeline: Timeline,
    speed: float,
    deliver: Callable[[Observation], None],
    timer: Timer = WALL_TIMER,
) -> None:
    """Deliver each observation at its `t_ms / speed` after the call (on `timer`); return after the last."""
    started_ms = timer.now_ms()
    burst = 0
    for t_ms, observation in timeline:
        at_ms = started_ms + int(t_ms / speed)
        if at_ms > timer.now_ms():
            burst = 0
            await timer.sleep_until(at_ms)
        elif burst >= _YIELD_EVERY:
            burst = 0
            await anyio.lowlevel.checkpoint()
        burst += 1
        deliver(observation)


async def finish_task(task: asyncio.Task[None]) -> None:
    """Cancel a player task and return once it has finished (a cancel of ours is raised after that)."""
    if task.done():
        return
    task.cancel()
    await finish_cleanup(asyncio.wait({task}))


class ReplaySession(BaseSession):
    """One replay session: a player task that stop() cancels and waits for."""

    def __init__(
        self, scope: DiscoveryScope, sink: ObservationSink, timeline: Timeline, speed: float, timer: Timer
    ) -> None:
        super().__init__(scope, sink, timer)
        self.opened()
        player = play_timeline(timeline, speed, self.deliver, timer)
        self._task: asyncio.Task[None] | None = asyncio.get_running_loop().create_task(player)

    @property
    def finished(self) -> bool:
        """True once the player has ended (last line played or stopped)."""
        return self._task is None or self._task.done()

    async def _stop_backend(self) -> str | None:
        """Cancel the player; acknowledged once it has finished."""
        if self._task is not None:
            await finish_task(self._task)
            # The finished task keeps its cancellation's traceback, whose frames hold this session:
            # dropped, no cycle is left for a full garbage collection to find.
            self._task = None
        return None


class ReplayProvider:
    """Plays one fixture file; any number of sessions may play it at once."""

    def __init__(self, path: Path | str, *, speed: float = 1.0, timer: Timer = WALL_TIMER) -> None:
        self._speed = check_speed(speed)
        self._timer = timer
        self._fixture = load_fixture(path)
        self._capabilities = ProviderCapabilities(transport=self._fixture.transport, concurrent_sessions=True)

    @property
    def capabilities(self) -> ProviderCapabilities:
        """Declared capabilities: the file's transport, concurrent sessions."""
        return self._capabilities

    @property
    def fixture(self) -> Fixture:
        """The parsed fixture."""
        return self._fixture

    async def start(self, scope: DiscoveryScope, sink: ObservationSink) -> ReplaySession:
        """Start playing the file for `scope`."""
        if scope.transport != self._fixture.transport:
            raise ProviderUnavailable("replay fixture transport does not match the scan transport")
        return ReplaySession(scope, sink, self._fixture.timeline, self._speed, self._timer)
