"""The fixture recorder: one session from a real provider, written as an `hw-fixtures/` file (CONTRACT §13).

Rules of this file:
- the recorder is the one place where observations leave memory, and only into the file the operator asked
  for: never into logs, messages or exceptions (messages name rules, never values or the output path);
- the provider runs with an unfiltered recording scope (mDNS: the chosen service types), because a fixture
  must hold everything the backend saw so that any later scope can be replayed against it;
- identities are pseudonymised unless the operator keeps them: BLE addresses, USB serial numbers and
  non-kernel device paths, mDNS instance labels, host names and IP addresses become stable salted
  pseudonyms (HMAC-SHA256 under a random per-recording salt that is never written anywhere). The same
  identity gets the same pseudonym within one file, two identities never share one, and two recordings
  share nothing. Payloads (names, manufacturer and service data, TXT) are kept, because replay needs them;
  TXT values only lose the identities of their own record (instance, host, addresses);
- the file is private (mode 0600) while it is written and after; it is written beside the target and
  renamed into place only when the recording completed, so an aborted or failed one leaves nothing behind;
- the header says honestly `"source": "recorded"`.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.metadata
import ipaddress
import json
import os
import platform
import re
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import IO, Any, Final

import anyio
from anyio.abc import TaskStatus

from connector.contract.transports import Transport
from connector.core.observations import BleObservation, MdnsObservation, Observation, UsbObservation
from connector.core.scope import DiscoveryScope, ScopeFilter, mdns_instance, normalise_service_type
from connector.core.transports import TRANSPORT_FACTS
from connector.errors import ProviderError, StopUnconfirmed
from providers.base import Provider, ProviderSession

FIXTURE_FORMAT: Final = "sensorium-hw-fixture.v1"
SOURCE_RECORDED: Final = "recorded"
MAX_RECORDING_SECONDS: Final = 3600
RECORDING_CLEANUP_TIMEOUT_MS: Final = 2000
# Distributions whose versions a header names (besides Python itself).
VERSIONED_DISTRIBUTIONS: Final = ("bleak", "zeroconf", "pyserial", "sensorium-os-connector")

# Kernel tty names (`/dev/ttyUSB0`, `/dev/ttyACM1`, `/dev/rfcomm0`) are enumeration slots, not identities.
_KERNEL_TTY: Final = re.compile(r"/dev/(?:tty[A-Za-z]*|rfcomm)[0-9]{1,4}")
_LOCAL_SUFFIX: Final = ".local"
# Pseudonyms of IP addresses come from ranges that never name a real host (RFC 2544, RFC 3849).
_IPV4_RANGE: Final = ipaddress.IPv4Network("198.18.0.0/15")
_IPV6_RANGE: Final = ipaddress.IPv6Network("2001:db8::/32")
# Identities shorter than this are not scrubbed from TXT values: they would mangle unrelated text.
_MIN_SCRUB_CHARS: Final = 3


# ---------------------------------------------------------------------------------------------------------
# Pseudonyms (pure apart from the random salt)


def _ble_form(digest: bytes) -> str:
    """A locally administered, unicast MAC (second-lowest bit of the first octet set, lowest clear)."""
    octets = bytes([(digest[0] & 0xFC) | 0x02]) + digest[1:6]
    return ":".join(f"{octet:02X}" for octet in octets)


def _ip_form(version: int) -> Callable[[bytes], str]:
    network = _IPV4_RANGE if version == 4 else _IPV6_RANGE
    host_bits = network.max_prefixlen - network.prefixlen

    def form(digest: bytes) -> str:
        offset = int.from_bytes(digest[:16], "big") % (1 << host_bits)
        return str(network.network_address + offset)

    return form


def _labelled(prefix: str, hex_chars: int) -> Callable[[bytes], str]:
    return lambda digest: f"{prefix}{digest.hex()[:hex_chars]}"


class Pseudonymiser:
    """Stable salted pseudonyms for one recording; the salt lives in this object only and is never written."""

    __slots__ = ("_given", "_salt", "_taken")

    def __init__(self, salt: bytes | None = None) -> None:
        self._salt = salt if salt is not None else secrets.token_bytes(32)
        self._given: dict[tuple[str, str], str] = {}
        self._taken: set[str] = set()

    def _pseudonym(self, kind: str, identity: str, form: Callable[[bytes], str]) -> str:
        """The pseudonym of `identity`; a fresh one is re-drawn until it collides with no other."""
        key = (kind, identity)
        known = self._given.get(key)
        if known is not None:
            return known
        for attempt in range(1 << 16):
            message = f"{kind}\x00{attempt}\x00{identity}".encode("utf-8", "surrogatepass")
            candidate = form(hmac.new(self._salt, message, hashlib.sha256).digest())
            if candidate not in self._taken:
                break
        else:  # pragma: no cover - 65536 collisions in a row do not happen
            raise RuntimeError("pseudonym space exhausted")
        self._given[key] = candidate
        self._taken.add(candidate)
        return candidate

    def ble_address(self, address: str) -> str:
        """A locally administered MAC string in place of a BLE address."""
        return self._pseudonym("ble", address.upper(), _ble_form)

    def serial_number(self, serial_number: str) -> str:
        """An opaque USB serial number."""
        return self._pseudonym("serial", serial_number, _labelled("psn-", 12))

    def device_path(self, device: str) -> str:
        """Kernel tty names stay (they are slots); any other path (e.g. a by-id link) becomes opaque."""
        if _KERNEL_TTY.fullmatch(device):
            return device
        return self._pseudonym("device", device, _labelled("/dev/serial-", 12))

    def instance_label(self, label: str) -> str:
        """An mDNS instance label; one device announced under several types keeps one pseudonym."""
        return self._pseudonym("instance", label.lower(), _labelled("device-", 10))

    def host_name(self, server: str) -> str:
        """An mDNS host name; the `.local` domain and a trailing dot are kept."""
        bare = server.rstrip(".")
        local = bare.lower().endswith(_LOCAL_SUFFIX)
        label = bare[: -len(_LOCAL_SUFFIX)] if local else bare
        pseudonym = self._pseudonym("host", label.lower(), _labelled("host-", 10))
        return pseudonym + (_LOCAL_SUFFIX if local else "") + ("." if server.endswith(".") else "")

    def ip_address(self, address: str) -> str:
        """An address from a range that never names a real host (same family); other text becomes opaque."""
        try:
            parsed = ipaddress.ip_address(address)
        except ValueError:
            return self._pseudonym("address", address, _labelled("addr-", 12))
        return self._pseudonym("ip", str(parsed), _ip_form(parsed.version))


def _scrub(text: str, replacements: Mapping[str, str]) -> str:
    """`text` with every identity in `replacements` (matched case-insensitively) swapped for its pseudonym."""
    for identity, pseudonym in replacements.items():
        if len(identity) >= _MIN_SCRUB_CHARS:
            text = _replace_insensitive(text, identity, pseudonym)
    return text


def _replace_insensitive(text: str, old: str, new: str) -> str:
    return re.compile(re.escape(old), re.IGNORECASE).sub(lambda _match: new, text)


def _pseudonymised_mdns(observation: MdnsObservation, names: Pseudonymiser) -> MdnsObservation:
    """Instance label, host name and addresses replaced; TXT values lose those same identities."""
    instance = mdns_instance(observation.name, observation.service_type)
    label = names.instance_label(instance)
    scrub = {instance: label}
    server = observation.server
    if server:
        scrub[server.rstrip(".")] = names.host_name(server.rstrip("."))
        server = names.host_name(server)
    addresses = tuple(names.ip_address(address) for address in observation.addresses)
    scrub.update(zip(observation.addresses, addresses, strict=True))
    # Longest first, so that a host name is replaced before an instance label it contains.
    ordered = dict(sorted(scrub.items(), key=lambda item: -len(item[0])))
    return replace(
        observation,
        name=label + observation.name[len(instance) :],
        server=server,
        addresses=addresses,
        txt={key: _scrub(value, ordered) for key, value in observation.txt.items()},
    )


def pseudonymised(observation: Observation, names: Pseudonymiser) -> Observation:
    """The observation with its identities replaced by this recording's pseudonyms."""
    if isinstance(observation, BleObservation):
        return observation._replace(address=names.ble_address(observation.address))
    if isinstance(observation, UsbObservation):
        serial_number = observation.serial_number
        return replace(
            observation,
            device=names.device_path(observation.device),
            serial_number=names.serial_number(serial_number) if serial_number else serial_number,
        )
    return _pseudonymised_mdns(observation, names)


# ---------------------------------------------------------------------------------------------------------
# Lines (CONTRACT §13)


@dataclass(frozen=True, slots=True)
class FixtureHeader:
    """Line 1 of a recorded fixture."""

    transport: Transport
    recorded_at: str
    adapter: str | None
    versions: Mapping[str, str]
    notes: str

    def line(self) -> dict[str, Any]:
        """The header object, in CONTRACT order."""
        return {
            "fixture": FIXTURE_FORMAT,
            "transport": self.transport,
            "source": SOURCE_RECORDED,
            "recorded_at": self.recorded_at,
            "adapter": self.adapter,
            "versions": dict(self.versions),
            "notes": self.notes,
        }


def rfc3339_seconds(now: datetime) -> str:
    """A UTC time at whole seconds with `Z`."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def library_versions() -> dict[str, str]:
    """Versions of the libraries a recording depends on, and of this package."""
    versions = {"python": platform.python_version()}
    for distribution in VERSIONED_DISTRIBUTIONS:
        try:
            versions[distribution] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            versions[distribution] = "not-installed"
    return versions


def _present(line: dict[str, Any], **optional: Any) -> dict[str, Any]:
    """`line` plus every optional field that carries something (None, empty lists and maps are omitted)."""
    line.update((key, value) for key, value in optional.items() if value not in (None, (), {}, []))
    return line


def _ble_line(observation: BleObservation, t_ms: int) -> dict[str, Any]:
    mfr = observation.manufacturer_data
    return _present(
        {"t_ms": t_ms, "address": observation.address, "rssi": observation.rssi},
        name=observation.name,
        service_uuids=list(observation.service_uuids),
        manufacturer_data={str(company): data.hex() for company, data in mfr.items()},
        service_data={uuid: data.hex() for uuid, data in observation.service_data.items()},
        tx_power=observation.tx_power,
        connectable=observation.connectable,
    )


def _usb_line(observation: UsbObservation, t_ms: int) -> dict[str, Any]:
    return _present(
        {"t_ms": t_ms, "event": observation.event, "device": observation.device},
        vid=observation.vid,
        pid=observation.pid,
        serial_number=observation.serial_number,
        manufacturer=observation.manufacturer,
        product=observation.product,
        location=observation.location,
        interface=observation.interface,
    )


def _mdns_line(observation: MdnsObservation, t_ms: int) -> dict[str, Any]:
    line = {
        "t_ms": t_ms,
        "event": observation.event,
        "service_type": observation.service_type,
        "name": observation.name,
    }
    return _present(
        line,
        server=observation.server,
        addresses=list(observation.addresses),
        port=observation.port,
        txt=dict(observation.txt),
        ttl=observation.ttl,
    )


def observation_line(observation: Observation, t_ms: int) -> dict[str, Any]:
    """The CONTRACT §13 line of one observation, `t_ms` after the start of the recording."""
    if isinstance(observation, BleObservation):
        return _ble_line(observation, t_ms)
    if isinstance(observation, UsbObservation):
        return _usb_line(observation, t_ms)
    return _mdns_line(observation, t_ms)


def encode_line(line: Mapping[str, Any]) -> str:
    """One JSON line, readable for the reviewer; text the UTF-8 file cannot hold is escaped instead."""
    text = json.dumps(line, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(line, ensure_ascii=True, separators=(",", ":"))
    return text + "\n"


def recording_scope(
    transport: Transport,
    seconds: int,
    *,
    adapter: str | None = None,
    service_types: Iterable[str] = (),
) -> DiscoveryScope:
    """The unfiltered scope of a recording (mDNS needs service types: they are the browser's only filter)."""
    types = tuple(dict.fromkeys(normalise_service_type(t) for t in service_types))
    facts = TRANSPORT_FACTS[transport]
    browsed = "service_types" in facts.required_filters
    return DiscoveryScope(
        transport=transport,
        window_seconds=seconds,
        max_candidates=64,
        max_snapshot_bytes=65536,
        filters=ScopeFilter(service_types=types) if browsed else ScopeFilter(),
        adapter=adapter if facts.takes("adapter") else None,
        cleanup_timeout_ms=RECORDING_CLEANUP_TIMEOUT_MS,
    )


# ---------------------------------------------------------------------------------------------------------
# The file


class FixtureFile:
    """A fixture being written: a private file beside the target, renamed into place by `commit()`."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self._partial = target.with_name(f".{target.name}.{secrets.token_hex(6)}.partial")
        self._stream: IO[str] | None = None

    @property
    def partial_path(self) -> Path:
        """Where the lines go until the recording completes."""
        return self._partial

    def open(self) -> None:
        """Create the partial file, readable and writable by its owner only."""
        fd = os.open(self._partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)
            self._stream = os.fdopen(fd, "w", encoding="utf-8", newline="\n")
        except BaseException:
            os.close(fd)
            self._partial.unlink(missing_ok=True)
            raise

    def write(self, line: Mapping[str, Any]) -> None:
        """Append one line."""
        assert self._stream is not None, "open() first"
        self._stream.write(encode_line(line))

    def commit(self) -> None:
        """Flush to disk and move the file into place (atomically, mode 0600 kept)."""
        stream, self._stream = self._stream, None
        assert stream is not None, "open() first"
        try:
            stream.flush()
            os.fsync(stream.fileno())
        finally:
            stream.close()
        os.replace(self._partial, self.target)

    def discard(self) -> None:
        """Close and delete the partial file. Idempotent."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
        self._partial.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------------------
# The recording


class RecordingOutcome(StrEnum):
    """How a recording ended."""

    RECORDED = "recorded"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class RecordingResult:
    """What a recording produced; `error` is the provider's failure or the unconfirmed stop."""

    outcome: RecordingOutcome
    observations: int
    written: bool
    stop_confirmed: bool = True
    error: ProviderError | None = None


@dataclass(slots=True)
class _State:
    """Mutable facts of one run (the event loop thread only)."""

    started_at: float = 0.0
    live: bool = False
    observations: int = 0
    aborted: bool = False
    failure: ProviderError | None = None
    write_error: OSError | None = None
    ended: anyio.Event | None = None

    def end(self) -> None:
        """Wake `run()`: the recording ends now."""
        self.live = False
        if self.ended is not None:
            self.ended.set()


class _Sink:
    """The provider's sink: every observation becomes one line (pseudonymised unless identities are kept)."""

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder

    def observe(self, observation: Observation) -> None:
        """One observation from the provider."""
        self._recorder._on_observation(observation)

    def fail(self, error: ProviderError) -> None:
        """The backend failed mid-recording."""
        self._recorder._on_failure(error)


class Recorder:
    """Records one provider session into a fixture file; `run()` once per recorder."""

    def __init__(
        self,
        provider: Provider,
        scope: DiscoveryScope,
        output: FixtureFile,
        header: FixtureHeader,
        *,
        pseudonymiser: Pseudonymiser | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._provider = provider
        self._scope = scope
        self._output = output
        self._header = header
        self._names = pseudonymiser
        self._clock = clock
        self._state = _State()

    @property
    def observations(self) -> int:
        """How many observations this run has written so far."""
        return self._state.observations

    def finish(self) -> None:
        """End the recording now and keep it, as the end of its window would."""
        self._state.end()

    def abort(self) -> None:
        """End the recording early and keep nothing (Ctrl-C); `run()` still confirms the provider's stop."""
        self._state.aborted = True
        self._state.end()

    async def run(
        self, seconds: float, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> RecordingResult:
        """Start the provider, record for `seconds`, stop it; `task_status` is set once the provider runs."""
        state = self._state
        state.ended = anyio.Event()
        self._output.open()
        try:
            self._output.write(self._header.line())
            session = await self._start()
        except ProviderError as error:
            self._output.discard()
            return RecordingResult(RecordingOutcome.FAILED, 0, written=False, error=error)
        except BaseException:
            self._output.discard()
            raise
        try:
            task_status.started()
            with anyio.move_on_after(max(0.0, state.started_at + seconds - self._clock())):
                if not state.aborted:
                    await state.ended.wait()
        except BaseException:
            state.aborted = True  # cancelled from outside: keep nothing, as after abort()
            raise
        finally:
            state.live = False
            with anyio.CancelScope(shield=True):
                stop_error = await self._stop(session)
            if self._keeps_nothing():
                self._output.discard()
        return self._conclude(stop_error)

    async def _start(self) -> ProviderSession:
        """Start the provider; the recording's clock starts when the start is requested."""
        self._state.started_at = self._clock()
        self._state.live = True
        try:
            return await self._provider.start(self._scope, _Sink(self))
        except BaseException:
            self._state.live = False
            raise

    async def _stop(self, session: ProviderSession) -> ProviderError | None:
        """Stop the session within the cleanup bound; the refusal, if the stop was not acknowledged."""
        try:
            with anyio.fail_after(self._scope.cleanup_timeout_ms / 1000 + 1.0):
                await session.stop()
        except TimeoutError:
            return StopUnconfirmed("the provider did not acknowledge the stop within the cleanup bound")
        except ProviderError as error:
            return error
        return None

    def _keeps_nothing(self) -> bool:
        state = self._state
        return state.aborted or state.failure is not None or state.write_error is not None

    def _conclude(self, stop_error: ProviderError | None) -> RecordingResult:
        """Commit the file of a complete recording and describe how the run ended."""
        state = self._state
        confirmed = stop_error is None
        if state.write_error is not None:
            raise state.write_error
        count = state.observations
        if state.failure is not None:
            return RecordingResult(RecordingOutcome.FAILED, count, False, confirmed, state.failure)
        if state.aborted:
            return RecordingResult(RecordingOutcome.ABORTED, count, False, confirmed, stop_error)
        try:
            self._output.commit()
        except BaseException:
            self._output.discard()
            raise
        return RecordingResult(RecordingOutcome.RECORDED, count, True, confirmed, stop_error)

    def _on_observation(self, observation: Observation) -> None:
        state = self._state
        if not state.live:
            return
        t_ms = max(0, int((self._clock() - state.started_at) * 1000))
        if self._names is not None:
            observation = pseudonymised(observation, self._names)
        try:
            self._output.write(observation_line(observation, t_ms))
        except OSError as error:
            self._end_with(write_error=error)
            return
        state.observations += 1

    def _on_failure(self, error: ProviderError) -> None:
        if self._state.live:
            self._end_with(failure=error)

    def _end_with(self, *, failure: ProviderError | None = None, write_error: OSError | None = None) -> None:
        state = self._state
        state.failure = state.failure or failure
        state.write_error = state.write_error or write_error
        state.end()
