"""The composition root: one connector process (state, runners, service, HTTP app) from a configuration."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from fastapi import APIRouter, FastAPI
from prometheus_client import CollectorRegistry, Gauge

from connector.api.app import Readiness, create_app
from connector.catalog.loader import load_verified_catalog
from connector.catalog.signing import VerifiedCatalog
from connector.core.observations import Transport
from connector.core.scope import DiscoveryScope
from connector.errors import ProviderError
from connector.runtime.commands import CommandRunner
from connector.runtime.manager import DiscoveryManager
from connector.service.connector import ConnectorService, wall_clock
from connector.storage.principals import PrincipalDirectory
from connector.storage.state import ConnectorState
from providers.base import ObservationSink, Provider, ProviderCapabilities, ProviderSession
from providers.registry import build_provider

_log = logging.getLogger("sensorium.serve")


@dataclass(frozen=True, slots=True)
class ConnectorConfig:
    """Everything `serve` needs; defaults are the embedded ones."""

    data_dir: Path = Path(".sensorium")
    catalog: Path = Path("catalog/actions.json")
    trust_dir: Path = Path("catalog/trust")
    replay: Mapping[str, Path] = field(default_factory=dict)
    replay_speed: float = 1.0
    ble_adapter: str | None = None
    mdns_interfaces: Sequence[str] | None = None
    nats_url: str | None = None
    max_body_bytes: int = 65536


@dataclass(slots=True)
class Assembled:
    """A running connector: its parts, for the HTTP server, the Bus and tests."""

    config: ConnectorConfig
    catalog: VerifiedCatalog
    service: ConnectorService
    discovery: DiscoveryManager
    commands: CommandRunner
    state: ConnectorState
    readiness: Readiness
    metrics: CollectorRegistry
    app: FastAPI


class _UnavailableProvider:
    """Stands in for a backend that could not be built: the session ends `failed` with its code."""

    def __init__(self, transport: Transport, error: ProviderError) -> None:
        self._capabilities = ProviderCapabilities(transport=transport, concurrent_sessions=True)
        self._error = error

    @property
    def capabilities(self) -> ProviderCapabilities:
        """Declared capabilities."""
        return self._capabilities

    async def start(self, scope: DiscoveryScope, sink: ObservationSink) -> ProviderSession:
        """Always refuses with the build error."""
        raise self._error


def provider_factory(config: ConnectorConfig) -> Callable[[str, str | None], Provider]:
    """Builds the provider of a transport: replay fixtures where configured, else the real backend."""

    def build(transport: str, adapter: str | None) -> Provider:
        name: Transport = transport  # type: ignore[assignment]  # admitted scopes only name known transports
        replay = config.replay.get(transport)
        try:
            return build_provider(
                name,
                replay=replay,
                replay_speed=config.replay_speed,
                ble_adapter=adapter or config.ble_adapter,
                mdns_interfaces=config.mdns_interfaces,
            )
        except ProviderError as error:
            return _UnavailableProvider(name, error)

    return build


@asynccontextmanager
async def assemble(
    config: ConnectorConfig,
    *,
    routers: Callable[[Assembled], Sequence[APIRouter]] = lambda _: (),
    clock: Callable[[], datetime] = wall_clock,
    providers: Callable[[str, str | None], Provider] | None = None,
) -> AsyncIterator[Assembled]:
    """Open every part in dependency order; close them in reverse, sessions first (confirmed stops)."""
    catalog = load_verified_catalog(
        config.catalog, trust_dir=config.trust_dir, data_dir=config.data_dir, now=clock()
    )
    readiness = Readiness(catalog_verified=True, bus_required=config.nats_url is not None)
    async with AsyncExitStack() as stack:
        state = await stack.enter_async_context(await ConnectorState.open(config.data_dir))
        commands = await stack.enter_async_context(CommandRunner(state))
        interrupted = await commands.recover(clock())
        if interrupted:
            _log.info("marked %d interrupted command operations", len(interrupted))
        discovery = await stack.enter_async_context(DiscoveryManager())
        readiness.interrupted_marked = True
        service = ConnectorService(
            catalog=catalog,
            principals=PrincipalDirectory(config.data_dir),
            discovery=discovery,
            commands=commands,
            state=state,
            providers=providers or provider_factory(config),
            clock=clock,
        )
        metrics = CollectorRegistry()
        _register_session_gauge(metrics, discovery)
        assembled = Assembled(
            config, catalog, service, discovery, commands, state, readiness, metrics, app=FastAPI()
        )
        assembled.app = create_app(
            service,
            readiness=readiness,
            metrics=metrics,
            routers=routers(assembled),
            max_body_bytes=config.max_body_bytes,
        )
        yield assembled


def _register_session_gauge(metrics: CollectorRegistry, discovery: DiscoveryManager) -> None:
    """Active discovery sessions, read at scrape time."""
    gauge = Gauge("sensorium_discovery_sessions_active", "Non-terminal discovery sessions", registry=metrics)
    gauge.set_function(lambda: float(discovery.active_count()))
