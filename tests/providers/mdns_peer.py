"""Test peers for the mDNS provider: a real zeroconf responder on 127.0.0.1 and a recording sink.

Every run uses its own service types and instance names, so parallel runs on one host never see each
other's services (they share UDP 5353 on loopback).
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import socket
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Self

from zeroconf import IPVersion
from zeroconf._dns import DNSPointer, DNSRecord, DNSService
from zeroconf._protocol.outgoing import DNSOutgoing
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf
from zeroconf.const import _CLASS_IN, _CLASS_UNIQUE, _FLAGS_AA, _FLAGS_QR_RESPONSE, _TYPE_PTR, _TYPE_SRV

from connector.core.observations import MdnsObservation, Observation
from connector.errors import ProviderError

LOOPBACK = "127.0.0.1"
RUN_ID = secrets.token_hex(4)


def run_service_type(label: str) -> str:
    """A service type private to this test run (label: a few letters)."""
    return f"_{label}{RUN_ID}._tcp.local."


def run_instance(label: str) -> str:
    """An instance name private to this test run."""
    return f"{label}-{RUN_ID}"


class Responder:
    """A second `AsyncZeroconf` on loopback that registers, updates and withdraws services."""

    def __init__(self) -> None:
        self._azc: AsyncZeroconf | None = None

    async def __aenter__(self) -> Self:
        self._azc = AsyncZeroconf(interfaces=[LOOPBACK], ip_version=IPVersion.V4Only)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._azc is not None:
            await self._azc.async_close()

    @property
    def azc(self) -> AsyncZeroconf:
        """The responder's engine."""
        assert self._azc is not None, "use Responder as an async context manager"
        return self._azc

    async def register(
        self,
        service_type: str,
        instance: str,
        properties: Mapping[str, str],
        *,
        port: int = 8080,
        ttl: int | None = None,
        with_address: bool = True,
    ) -> AsyncServiceInfo:
        """Register an instance without probing (cooperating responders)."""
        info = service_info(service_type, instance, properties, port=port, ttl=ttl, with_address=with_address)
        await self.azc.async_register_service(info, cooperating_responders=True)
        return info

    async def update(self, info: AsyncServiceInfo, properties: Mapping[str, str]) -> AsyncServiceInfo:
        """Announce new TXT properties for a registered instance."""
        instance = info.name[: -len(info.type) - 1]
        fresh = service_info(info.type, instance, properties, port=info.port or 0, ttl=info.other_ttl)
        await self.azc.async_update_service(fresh)
        return fresh

    async def unregister(self, info: AsyncServiceInfo) -> None:
        """Withdraw an instance (goodbye packets)."""
        await self.azc.async_unregister_service(info)

    def forget(self, info: AsyncServiceInfo) -> None:
        """Stop answering for an instance without a goodbye (a responder that vanished)."""
        self.azc.zeroconf.registry.async_remove(info)

    def announce(self, records: Sequence[DNSRecord]) -> None:
        """Multicast raw answer records (split over as many packets as they need)."""
        out = DNSOutgoing(_FLAGS_QR_RESPONSE | _FLAGS_AA)
        for record in records:
            out.add_answer_at_time(record, 0)
        self.azc.zeroconf.async_send(out)


def ptr(service_type: str, alias: str, ttl: int = 4500) -> DNSPointer:
    """A shared PTR record `service_type -> alias`."""
    return DNSPointer(service_type, _TYPE_PTR, _CLASS_IN, ttl, alias)


def srv(name: str, port: int, server: str, *, unique: bool = True, ttl: int = 120) -> DNSService:
    """An SRV record; `unique=False` omits the cache-flush bit, so a second one can sit beside it."""
    class_ = _CLASS_IN | _CLASS_UNIQUE if unique else _CLASS_IN
    return DNSService(name, _TYPE_SRV, class_, ttl, 0, 0, port, server)


def service_info(
    service_type: str,
    instance: str,
    properties: Mapping[str, str],
    *,
    port: int,
    ttl: int | None = None,
    with_address: bool = True,
) -> AsyncServiceInfo:
    """An `AsyncServiceInfo` for a loopback service; `ttl` sets every record TTL."""
    make = functools.partial(
        AsyncServiceInfo,
        service_type,
        f"{instance}.{service_type}",
        addresses=[socket.inet_aton(LOOPBACK)] if with_address else [],
        port=port,
        properties=dict(properties),
        server=f"{instance}.local.",
    )
    return make() if ttl is None else make(host_ttl=ttl, other_ttl=ttl)


class RecordingSink:
    """Collects what a provider session delivers and lets a test wait for it."""

    def __init__(self) -> None:
        self.observations: list[Observation] = []
        self.failures: list[ProviderError] = []
        self._changed = asyncio.Event()

    def observe(self, observation: Observation) -> None:
        """Record one observation."""
        self.observations.append(observation)
        self._changed.set()

    def fail(self, error: ProviderError) -> None:
        """Record a backend failure."""
        self.failures.append(error)
        self._changed.set()

    @property
    def mdns(self) -> list[MdnsObservation]:
        """The mDNS observations, in order."""
        return [o for o in self.observations if isinstance(o, MdnsObservation)]

    async def wait_for(
        self, predicate: Callable[[MdnsObservation], bool], timeout_s: float = 5.0
    ) -> MdnsObservation:
        """The first observation matching `predicate`, waiting up to `timeout_s`."""
        async with asyncio.timeout(timeout_s):
            while True:
                found = next((o for o in self.mdns if predicate(o)), None)
                if found is not None:
                    return found
                self._changed.clear()
                await self._changed.wait()
