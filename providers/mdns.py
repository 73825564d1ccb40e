"""mDNS provider: one shared python-zeroconf engine, one `AsyncServiceBrowser` per session.

The browser asks only for the scope's service types (the backend filter); every resolved instance is
re-filtered with `matches_scope` before it reaches the sink. Questions are QM: a unicast (QU) reply is
lost when several responders share port 5353 on one host.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from zeroconf import (
    DNSQuestionType,
    InterfaceChoice,
    IPVersion,
    ServiceStateChange,
    Zeroconf,
    current_time_millis,
)
from zeroconf import Error as ZeroconfError
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from connector.core.observations import MdnsObservation
from connector.core.scope import DiscoveryScope, matches_scope, normalise_service_type
from connector.errors import ProviderError, ProviderUnavailable, StopUnconfirmed
from providers.base import ObservationSink, ProviderCapabilities

DEFAULT_RESOLVE_TIMEOUT_MS = 1500
_START_TIMEOUT_S = 2.0
_MAX_TEXT = 256
_MAX_ITEMS = 64


def _bounded_txt(properties: Mapping[str, str | None]) -> dict[str, str]:
    """TXT entries as str -> str, at most 64 of them, each string bounded."""
    items = [(key[:_MAX_TEXT], (value or "")[:_MAX_TEXT]) for key, value in properties.items() if key]
    return dict(items[:_MAX_ITEMS])


def shortest_ttl(zc: Zeroconf, info: AsyncServiceInfo) -> int | None:
    """Seconds left on the shortest-lived cached PTR, SRV, TXT or address record, rounded up."""
    wanted = [info.dns_pointer(), info.dns_text(), *info.dns_addresses()]
    if info.server and info.port is not None:
        wanted.append(info.dns_service())
    now = current_time_millis()
    cached = (zc.cache.get(record) for record in wanted)
    remaining = [record.get_remaining_ttl(now) for record in cached if record is not None]
    return math.ceil(min(remaining)) if remaining else None


def info_observation(zc: Zeroconf, info: AsyncServiceInfo, service_type: str) -> MdnsObservation:
    """The `add` observation for a (possibly partly) resolved instance."""
    return MdnsObservation(
        event="add",
        service_type=service_type,
        name=info.name,
        server=info.server[:_MAX_TEXT] if info.server else None,
        addresses=tuple(info.parsed_addresses()[:_MAX_ITEMS]),
        port=info.port,
        txt=_bounded_txt(info.decoded_properties),
        ttl=shortest_ttl(zc, info),
    )


def _interface_addresses(interfaces: Sequence[str] | None) -> tuple[str, ...] | None:
    """Validated IPv4 interface addresses; None means every interface of the host."""
    if interfaces is None:
        return None
    try:
        addresses = tuple(str(ipaddress.IPv4Address(address)) for address in interfaces)
    except ValueError:
        raise ValueError("mdns interfaces must be IPv4 addresses") from None
    if not addresses:
        raise ValueError("mdns interfaces must not be empty")
    return addresses


# One engine per event loop and interface choice: every session (of every provider object) in the process
# shares it, and only process shutdown (`MdnsProvider.aclose`) closes it.
_EngineKey = tuple[asyncio.AbstractEventLoop, tuple[str, ...] | None]
_ENGINES: dict[_EngineKey, AsyncZeroconf] = {}


def _shared_engine(interfaces: tuple[str, ...] | None) -> AsyncZeroconf:
    """The engine for the running loop and `interfaces`, created on first use."""
    for stale in [key for key, azc in _ENGINES.items() if key[0].is_closed() or azc.zeroconf.done]:
        del _ENGINES[stale]
    key = (asyncio.get_running_loop(), interfaces)
    azc = _ENGINES.get(key)
    if azc is None:
        choice: list[str] | InterfaceChoice = list(interfaces) if interfaces else InterfaceChoice.All
        try:
            azc = AsyncZeroconf(interfaces=choice, ip_version=IPVersion.V4Only)
        except OSError:
            raise ProviderUnavailable("mdns sockets could not be opened") from None
        _ENGINES[key] = azc
    return azc


async def _close_shared_engine(interfaces: tuple[str, ...] | None) -> None:
    """Close the running loop's engine for `interfaces`, if there is one."""
    azc = _ENGINES.pop((asyncio.get_running_loop(), interfaces), None)
    if azc is not None:
        await azc.async_close()


class MdnsProvider:
    """Browses through the process's shared `AsyncZeroconf`; one `AsyncServiceBrowser` per session."""

    def __init__(
        self, interfaces: Sequence[str] | None = None, *, resolve_timeout_ms: int = DEFAULT_RESOLVE_TIMEOUT_MS
    ) -> None:
        self._interfaces = _interface_addresses(interfaces)
        self._resolve_timeout_ms = resolve_timeout_ms
        self._sessions: set[MdnsSession] = set()

    @property
    def capabilities(self) -> ProviderCapabilities:
        """Zeroconf filters by service type; browsers share the engine, so sessions run concurrently."""
        return ProviderCapabilities(
            transport="mdns", backend_filters=frozenset({"service_types"}), concurrent_sessions=True
        )

    async def start(self, scope: DiscoveryScope, sink: ObservationSink) -> MdnsSession:
        """Start a browser for the scope's service types."""
        if scope.transport != "mdns":
            raise ProviderError("scope transport is not mdns")
        if not scope.filters.service_types:
            raise ProviderError("mdns scope has no service_types filter")
        zc = await self._started_engine()
        session = MdnsSession(zc, scope, sink, self._resolve_timeout_ms, self._sessions.discard)
        try:
            session.start()
        except (ZeroconfError, OSError):
            raise ProviderError("mdns browser could not start") from None
        self._sessions.add(session)
        return session

    async def aclose(self) -> None:
        """Process shutdown: stop this provider's sessions, then close the shared engine. Idempotent."""
        for session in list(self._sessions):
            with contextlib.suppress(StopUnconfirmed):
                await session.stop()
        await _close_shared_engine(self._interfaces)

    async def _started_engine(self) -> Zeroconf:
        """The shared engine, once its sockets are serving."""
        zc = _shared_engine(self._interfaces).zeroconf
        try:
            await zc.async_wait_for_start(timeout=_START_TIMEOUT_S)
        except ZeroconfError:
            raise ProviderUnavailable("mdns engine did not start") from None
        return zc


class MdnsSession:
    """One browser plus its resolution tasks; `stop()` returns once both are done."""

    def __init__(
        self,
        zc: Zeroconf,
        scope: DiscoveryScope,
        sink: ObservationSink,
        resolve_timeout_ms: int,
        on_stopped: Callable[[MdnsSession], None],
    ) -> None:
        self._zc = zc
        self._scope = scope
        self._sink = sink
        self._resolve_timeout_ms = resolve_timeout_ms
        self._on_stopped = on_stopped
        self._types = sorted({normalise_service_type(t) for t in scope.filters.service_types})
        self._browser: AsyncServiceBrowser | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # every unfinished resolution, cancelled ones too
        self._latest: dict[str, asyncio.Task[None]] = {}  # per instance: the resolution that may report
        self._reported: dict[str, MdnsObservation] = {}
        self._closed = False  # nothing reaches the sink once stop() began
        self._confirmed = False

    def start(self) -> None:
        """Create the browser (it starts querying at once)."""
        self._browser = AsyncServiceBrowser(
            self._zc, self._types, handlers=[self._on_change], question_type=DNSQuestionType.QM
        )

    async def stop(self) -> None:
        """Cancel the browser and wait for its resolution tasks, within the cleanup timeout."""
        if self._confirmed:
            return
        self._closed = True
        try:
            async with asyncio.timeout(self._scope.cleanup_timeout_ms / 1000):
                await self._cancel_browser()
                await self._drain_resolutions()
        except TimeoutError:
            raise StopUnconfirmed("mdns browser did not stop within the cleanup timeout") from None
        except (ZeroconfError, OSError):
            raise StopUnconfirmed("mdns browser refused to stop") from None
        self._confirmed = True
        self._on_stopped(self)

    async def _cancel_browser(self) -> None:
        """Cancel the browser once; a retried stop skips an already cancelled one."""
        if self._browser is not None and not self._browser.done:
            await self._browser.async_cancel()

    async def _drain_resolutions(self) -> None:
        """Cancel pending resolutions and wait until each has finished."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _on_change(
        self, zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange
    ) -> None:
        """Browser callback (event loop thread)."""
        if self._closed:
            return
        if state_change is ServiceStateChange.Removed:
            self._removed(service_type, name)
        else:
            self._resolve_soon(service_type, name)

    def _resolve_soon(self, service_type: str, name: str) -> None:
        """(Re)start the resolution of one instance; the latest change wins."""
        key = name.lower()
        self._cancel_resolution(key)
        task = asyncio.get_running_loop().create_task(self._resolve(service_type, name))
        self._tasks.add(task)
        self._latest[key] = task
        task.add_done_callback(lambda done: self._forget_task(key, done))

    def _cancel_resolution(self, key: str) -> None:
        """Cancel the pending resolution of one instance, if any (it stays tracked until done)."""
        pending = self._latest.pop(key, None)
        if pending is not None:
            pending.cancel()

    def _forget_task(self, key: str, task: asyncio.Task[None]) -> None:
        """Drop a finished resolution."""
        self._tasks.discard(task)
        if self._latest.get(key) is task:
            del self._latest[key]

    async def _resolve(self, service_type: str, name: str) -> None:
        """Resolve one instance with a bounded request, then report it."""
        info = AsyncServiceInfo(service_type, name)
        try:
            await info.async_request(self._zc, self._resolve_timeout_ms, question_type=DNSQuestionType.QM)
        except (ZeroconfError, OSError):
            self._fail(ProviderError("mdns resolution failed"))
            return
        self._report(info_observation(self._zc, info, service_type))

    def _report(self, observation: MdnsObservation) -> None:
        """Deliver an in-scope `add`, or an `update` for an instance already reported."""
        if self._closed or not matches_scope(self._scope, observation):
            return
        key = observation.name.lower()
        if key in self._reported:
            observation = replace(observation, event="update")
        self._reported[key] = observation
        self._sink.observe(observation)

    def _removed(self, service_type: str, name: str) -> None:
        """Report the removal of an instance this session reported before."""
        key = name.lower()
        self._cancel_resolution(key)
        last = self._reported.pop(key, None)
        if last is not None:
            self._sink.observe(replace(last, event="remove", ttl=None))

    def _fail(self, error: ProviderError) -> None:
        """Report a backend failure unless the session is stopping."""
        if not self._closed:
            self._sink.fail(error)
