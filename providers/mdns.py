"""mDNS provider: every session runs its own python-zeroconf engine, so only answers it received count.

CONTRACT §6.5 read against python-zeroconf 0.154:
- An engine's `DNSCache` (`_cache.py`) keeps records until their TTL runs out, and a new `ServiceBrowser`
  is fed every unexpired cached PTR (`_handlers/record_manager.py _async_update_matching_records`). A
  per-session `AsyncZeroconf` starts with an empty cache: a responder that went silent before the session
  started cannot reappear from it.
- The browser reports a PTR once (`_services/browser.py async_update_records`: a re-received PTR only
  reschedules its refresh), and known-answer suppression keeps responders quiet while the PTR is valid. So
  presence is read from the session's cache: a *presence pass* at most every `PRESENCE_INTERVAL_S` reports
  every seen instance whose PTR is unexpired, which advances `last_seen_at`; a goodbye (TTL 0 removes the
  record at once) or the PTR's expiry reports a removal.
- An instance is *seen* once its SRV record is in the session's cache (`AsyncServiceInfo.async_request`
  answers from the cache when the responder sent it as an additional record, else asks with QM questions).
  A request that timed out without an SRV reports nothing; the instance is asked again later.
- Out-of-scope instances are dropped on their PTR name, before any `AsyncServiceInfo` exists for them.
  At most `max_candidates + 1` instances are tracked (one more lets the table end the session with
  `limit-reached`); the engine's cache is bounded by python-zeroconf itself (`_MAX_CACHE_RECORDS`).
- TXT values are never kept. zeroconf's own log lines quote record names, so its logger is silenced.
Questions are QM: a unicast (QU) reply is lost when several sockets share port 5353 on one host.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from typing import Any

import anyio
from zeroconf import (
    BadTypeInNameException,
    DNSQuestionType,
    ServiceStateChange,
    Zeroconf,
    current_time_millis,
)
from zeroconf import Error as ZeroconfError
from zeroconf._dns import DNSPointer, DNSService
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf
from zeroconf.const import _CLASS_IN, _TYPE_PTR, _TYPE_SRV

from connector.core.observations import MdnsObservation
from connector.core.scope import DiscoveryScope, normalise_service_type
from connector.errors import ProviderError, ProviderUnavailable, StopUnconfirmed
from providers.base import BaseSession, ObservationSink, ProviderCapabilities, StopOutcome, finish_cleanup
from providers.mdns_interfaces import (
    InterfaceSetting,
    NoMulticastInterface,
    Selection,
    check_setting,
    select_interfaces,
)

DEFAULT_RESOLVE_TIMEOUT_MS = 1500
PRESENCE_INTERVAL_S = 0.5  # CONTRACT §6.5: presence passes at most 1 s apart
RETRY_RESOLVE_S = 3.0  # an instance whose SRV did not arrive is asked again after this long
_START_TIMEOUT_S = 2.0
_CLOSE_BOUND_S = 2.0  # an engine closed on a failed start: how long the failing caller waits for it
_MAX_TEXT = 256
_MAX_ITEMS = 64
_log = logging.getLogger("sensorium.mdns")


def _quiet_zeroconf_logs() -> None:
    """python-zeroconf logs record names and addresses (e.g. invalid addresses at WARNING)."""
    log = logging.getLogger("zeroconf")
    if log.getEffectiveLevel() <= logging.CRITICAL:
        log.setLevel(logging.CRITICAL + 1)


def live_ptr_ttl(zc: Zeroconf, service_type: str, name: str, now_ms: float) -> int | None:
    """Seconds left (rounded up) on the unexpired PTR `service_type -> name` in `zc`'s cache, else None."""
    key = name.lower()
    best: float | None = None
    for record in zc.cache.get_all_by_details(service_type, _TYPE_PTR, _CLASS_IN):
        if isinstance(record, DNSPointer) and record.alias.lower() == key and not record.is_expired(now_ms):
            remaining = record.get_remaining_ttl(now_ms)
            best = remaining if best is None else max(best, remaining)
    return None if best is None else max(1, math.ceil(best))


def live_srvs(zc: Zeroconf, name: str, now_ms: float) -> set[tuple[str, int]]:
    """The distinct (server, port) of the unexpired SRV records for `name`."""
    return {
        (record.server_key, record.port)
        for record in zc.cache.get_all_by_details(name, _TYPE_SRV, _CLASS_IN)
        if isinstance(record, DNSService) and not record.is_expired(now_ms)
    }


@dataclass(slots=True)
class _Instance:
    """One tracked in-scope instance of a session."""

    service_type: str
    name: str
    reported: MdnsObservation | None = None
    task: asyncio.Task[None] | None = None
    next_try_ms: float = 0.0
    skipped: bool = False  # a name collision: never reported while its PTR lives


class MdnsProvider:
    """Starts one engine and one `AsyncServiceBrowser` per session; sessions run concurrently."""

    def __init__(
        self,
        interfaces: Sequence[str] | str | None = None,
        *,
        resolve_timeout_ms: int = DEFAULT_RESOLVE_TIMEOUT_MS,
        presence_interval_s: float = PRESENCE_INTERVAL_S,
    ) -> None:
        if not 0 < presence_interval_s <= 1.0:
            raise ValueError("presence_interval_s must be in (0, 1] seconds")
        self._interfaces: InterfaceSetting = check_setting(interfaces)
        self._resolve_timeout_ms = resolve_timeout_ms
        self._presence_interval_s = presence_interval_s
        self._sessions: set[MdnsSession] = set()
        _quiet_zeroconf_logs()

    @property
    def capabilities(self) -> ProviderCapabilities:
        """Zeroconf filters by service type; each session has its own engine, so sessions run concurrently."""
        return ProviderCapabilities(
            transport="mdns", backend_filters=frozenset({"service_types"}), concurrent_sessions=True
        )

    async def start(self, scope: DiscoveryScope, sink: ObservationSink) -> MdnsSession:
        """Choose the interfaces, open the session's engine, start its browser."""
        if scope.transport != self.capabilities.transport:
            raise ProviderError("scope transport is not mdns")
        if not scope.filters.service_types:
            raise ProviderError("mdns scope has no service_types filter")
        try:
            selection = select_interfaces(self._interfaces)
        except NoMulticastInterface as reason:
            raise ProviderUnavailable(str(reason)) from None
        azc = await open_engine(selection)
        session = MdnsSession(
            azc, scope, sink, self._resolve_timeout_ms, self._presence_interval_s, self._sessions.discard
        )
        try:
            session.start()
        except BaseException as failure:
            await session.discard()
            if isinstance(failure, ZeroconfError | OSError):
                raise ProviderError("mdns browser could not start") from None
            raise
        self._sessions.add(session)
        return session

    async def aclose(self) -> None:
        """Process shutdown: stop this provider's open sessions (each closes its own engine). Idempotent."""
        for session in list(self._sessions):
            try:
                await session.stop()
            except StopUnconfirmed:
                pass
            except Exception as failure:  # one session's fault must not keep the others open
                _log.warning("mdns session stop failed at shutdown: %s", type(failure).__name__)


async def open_engine(selection: Selection) -> AsyncZeroconf:
    """An engine on the selected interfaces, serving; ProviderUnavailable when no socket could join."""
    try:
        azc = AsyncZeroconf(interfaces=list(selection.interfaces), ip_version=selection.ip_version)
    except (OSError, RuntimeError, ValueError):
        raise ProviderUnavailable("mdns sockets could not be opened on the chosen interfaces") from None
    try:
        await azc.zeroconf.async_wait_for_start(timeout=_START_TIMEOUT_S)
    except BaseException as failure:  # cancelled too: the engine's sockets must not outlive the start
        await close_regardless(azc.async_close)
        if isinstance(failure, ZeroconfError):
            raise ProviderUnavailable("mdns engine did not start") from None
        raise
    if not azc.zeroconf.engine.senders:
        await close_regardless(azc.async_close)
        raise ProviderUnavailable("no multicast-capable interface could be joined")
    return azc


async def close_regardless(close: Callable[[], Coroutine[Any, Any, object]]) -> None:
    """Run `close` to its end (at most `_CLOSE_BOUND_S`) even while the caller is being cancelled; its
    failure is dropped, a cancel that came meanwhile is raised after (`finish_cleanup`)."""
    await finish_cleanup(_bounded_close(close))


async def _bounded_close(close: Callable[[], Coroutine[Any, Any, object]]) -> None:
    with anyio.move_on_after(_CLOSE_BOUND_S), contextlib.suppress(Exception):
        await close()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Done callback: fetch a task's exception so asyncio never logs it (its text may quote records)."""
    if not task.cancelled():
        task.exception()


def engine_sockets(azc: AsyncZeroconf) -> list[socket.socket]:
    """Every socket the engine reads or sends on."""
    engine = azc.zeroconf.engine
    found: list[socket.socket] = []
    for wrapped in (*engine.readers, *engine.senders):
        sock = wrapped.transport.get_extra_info("socket")
        if sock is not None and sock not in found:
            found.append(sock)
    return found


class MdnsSession(BaseSession):
    """One engine, its browser, the presence pass and the resolutions; `stop()` returns once all are gone."""

    # A stalled engine close is dropped and a later stop() starts afresh (nothing outside can answer it).
    rejoin_stalled_attempt = False

    def __init__(
        self,
        azc: AsyncZeroconf,
        scope: DiscoveryScope,
        sink: ObservationSink,
        resolve_timeout_ms: int,
        presence_interval_s: float,
        on_stopped: Callable[[MdnsSession], None],
    ) -> None:
        super().__init__(scope, sink)
        self._azc = azc
        self._zc = azc.zeroconf
        self._resolve_timeout_ms = resolve_timeout_ms
        self._presence_interval_s = presence_interval_s
        self._on_stopped = on_stopped
        self._types = sorted({normalise_service_type(t) for t in scope.filters.service_types})
        self._cap = scope.max_candidates + 1
        self._tracked: dict[str, _Instance] = {}
        self._overflowed = False  # an in-scope instance was not tracked for lack of room
        self._browser: AsyncServiceBrowser | None = None
        self._presence: asyncio.Task[None] | None = None
        self._sockets = engine_sockets(azc)

    @property
    def tracked_count(self) -> int:
        """How many instances the session holds (bounded by the scope's `max_candidates` + 1)."""
        return len(self._tracked)

    def start(self) -> None:
        """Open the gate, then create the browser (it starts querying at once) and the presence pass."""
        # First: the browser reports what the session's engine already overheard while it was created.
        self.opened()
        self._browser = AsyncServiceBrowser(
            self._zc, self._types, handlers=[self._on_change], question_type=DNSQuestionType.QM
        )
        self._presence = asyncio.get_running_loop().create_task(self._presence_loop())
        self._presence.add_done_callback(_retrieve)

    # -- stop ------------------------------------------------------------------------------------------------

    async def stop(self) -> StopOutcome:
        """The base's bounded stop; a confirmed session leaves its provider's list."""
        outcome = await super().stop()
        self._on_stopped(self)
        return outcome

    async def discard(self) -> None:
        """A session whose start failed: end its tasks and engine (bounded, even while cancelled)."""
        self._open = False
        await close_regardless(self._stop_backend)

    async def _stop_backend(self) -> str | None:
        """One attempt (the shape of the shared base's): None once every task and socket is gone."""
        tasks = [t for t in (self._presence, *(i.task for i in self._tracked.values())) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            if self._browser is not None and not self._browser.done:
                await self._browser.async_cancel()
            if not self._zc.done:
                await self._azc.async_close()
        except (ZeroconfError, OSError):
            return "mdns-engine-refused"
        while any(sock.fileno() != -1 for sock in self._sockets):
            await asyncio.sleep(0.005)
        self._tracked.clear()
        return None

    # -- delivery --------------------------------------------------------------------------------------------

    # -- browser callbacks -----------------------------------------------------------------------------------

    def _on_change(
        self, zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange
    ) -> None:
        """Browser callback (event loop thread): the cache already holds the batch's records."""
        if not self.is_open:
            return
        try:
            self._changed(service_type, name, state_change)
        except Exception:  # raised into zeroconf, its text (may quote names) would reach asyncio's log
            self.fail(ProviderError("mdns browser event failed"))

    def _changed(self, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        """One browser event of an open session."""
        key = name.lower()
        if state_change is ServiceStateChange.Removed:
            self._drop(key)
            return
        instance = self._tracked.get(key)
        if instance is None:
            self._consider(service_type, name)
        elif state_change is ServiceStateChange.Updated and instance.task is None:
            self._refresh_details(instance)  # an SRV that came late, or a changed one

    def _consider(self, service_type: str, name: str) -> None:
        """Track a new in-scope instance and resolve it; out-of-scope names are forgotten at once."""
        if not self._in_scope(MdnsObservation(event="add", service_type=service_type, name=name)):
            return
        if len(self._tracked) >= self._cap:
            self._overflowed = True
            return
        instance = _Instance(service_type, name)
        self._tracked[name.lower()] = instance
        self._resolve_soon(instance)

    def _drop(self, key: str) -> None:
        """The instance's PTR is gone: stop tracking it and report its removal if it was reported."""
        instance = self._tracked.pop(key, None)
        if instance is None:
            return
        if instance.task is not None:
            instance.task.cancel()
        if instance.reported is not None:
            self.deliver(replace(instance.reported, event="remove", ttl=None))

    # -- resolution ------------------------------------------------------------------------------------------

    def _resolve_soon(self, instance: _Instance) -> None:
        task = asyncio.get_running_loop().create_task(self._resolve(instance))
        instance.task = task
        task.add_done_callback(lambda done: self._resolution_done(instance, done))

    def _resolution_done(self, instance: _Instance, task: asyncio.Task[None]) -> None:
        _retrieve(task)
        if instance.task is task:
            instance.task = None

    async def _resolve(self, instance: _Instance) -> None:
        """Resolve one instance; an unexpected fault ends the session with a fixed text (never its own)."""
        try:
            await self._resolve_once(instance)
        except Exception:
            self.fail(ProviderError("mdns resolution failed"))

    async def _resolve_once(self, instance: _Instance) -> None:
        """Ask for the instance's records (answered from the cache when they came with the PTR)."""
        try:
            info = AsyncServiceInfo(instance.service_type, instance.name)
        except BadTypeInNameException:  # a malformed name from a responder: skipped
            instance.skipped = True
            return
        with contextlib.suppress(ZeroconfError, OSError):
            await info.async_request(self._zc, self._resolve_timeout_ms, question_type=DNSQuestionType.QM)
        instance.next_try_ms = current_time_millis() + RETRY_RESOLVE_S * 1000
        self._report(instance, info)

    def _refresh_details(self, instance: _Instance) -> None:
        """An SRV, TXT or address record of a reported instance changed: report it from the cache."""
        try:
            info = AsyncServiceInfo(instance.service_type, instance.name)
        except BadTypeInNameException:
            return
        info.load_from_cache(self._zc)
        self._report(instance, info)

    def _report(self, instance: _Instance, info: AsyncServiceInfo) -> None:
        """Report the instance when its SRV is known and unambiguous; a collision skips it."""
        now = current_time_millis()
        srvs = live_srvs(self._zc, instance.name, now)
        ttl = live_ptr_ttl(self._zc, instance.service_type, instance.name, now)
        if len(srvs) > 1:
            instance.skipped = True
        if instance.skipped or not srvs or ttl is None or info.port is None:
            if instance.skipped and instance.reported is not None:
                self.deliver(replace(instance.reported, event="remove", ttl=None))
                instance.reported = None
            return
        observation = MdnsObservation(
            event="add" if instance.reported is None else "update",
            service_type=instance.service_type,
            name=info.name,
            server=info.server[:_MAX_TEXT] if info.server else None,
            addresses=tuple(info.parsed_scoped_addresses()[:_MAX_ITEMS]),
            port=info.port,
            ttl=ttl,
        )
        instance.reported = observation
        self.deliver(observation)

    # -- presence --------------------------------------------------------------------------------------------

    async def _presence_loop(self) -> None:
        """Every pass: refresh what is present, drop what expired, retry what did not resolve."""
        try:
            while True:
                await asyncio.sleep(self._presence_interval_s)
                self.presence_pass(current_time_millis())
        except Exception:  # a silent stop would freeze `last_seen_at`; the text may quote record names
            self.fail(ProviderError("mdns presence pass failed"))

    def presence_pass(self, now_ms: float) -> None:
        """One pass over the tracked instances against the session's cache."""
        for key, instance in list(self._tracked.items()):
            ttl = live_ptr_ttl(self._zc, instance.service_type, instance.name, now_ms)
            if ttl is None:
                self._drop(key)
            elif instance.reported is not None:
                instance.reported = _refreshed(instance.reported, ttl)
                self.deliver(instance.reported)
            elif instance.task is None and not instance.skipped and now_ms >= instance.next_try_ms:
                self._resolve_soon(instance)
        if self._overflowed and len(self._tracked) < self._cap:
            self._overflowed = False
            self._admit_from_cache(now_ms)

    def _admit_from_cache(self, now_ms: float) -> None:
        """Room again after an overflow: track in-scope instances the cache holds, up to the cap."""
        for service_type in self._types:
            for record in self._zc.cache.get_all_by_details(service_type, _TYPE_PTR, _CLASS_IN):
                if not isinstance(record, DNSPointer) or record.is_expired(now_ms):
                    continue
                if record.alias.lower() not in self._tracked:
                    self._consider(service_type, record.alias)


def _refreshed(observation: MdnsObservation, ttl: int) -> MdnsObservation:
    """The same instance seen again at a presence pass."""
    return replace(observation, event="update", ttl=ttl)
