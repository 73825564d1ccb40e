"""The composition root: one connector process (state, runners, service, host, HTTP app, Bus) from a config.

The outermost module: it alone knows every room, and hands each part the small ports it needs.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import anyio
from fastapi import APIRouter, FastAPI
from prometheus_client import CollectorRegistry, Gauge

from connector.api.app import create_app
from connector.bus.adapter import BusAdapter, BusSettings
from connector.bus.node import BrokerAccess, node_metadata
from connector.catalog.loader import load_verified_catalog
from connector.catalog.signing import VerifiedCatalog
from connector.contract.transports import Transport
from connector.core.candidates import format_ms
from connector.core.clock import from_ms, to_ms, wall_clock
from connector.core.policy import DeferredHostPolicy
from connector.core.scope import DiscoveryScope
from connector.errors import ProviderError
from connector.host.metrics import HostMetrics
from connector.host.poller import Poller
from connector.host.service import HostService
from connector.resources import version
from connector.runtime.commands import CommandRunner
from connector.runtime.manager import DiscoveryManager
from connector.service.connector import ConnectorService
from connector.storage.principals import PrincipalDirectory
from connector.storage.registry import DeferredRegistry
from connector.storage.state import ConnectorState
from connector.telemetry.metrics import Telemetry
from connector.telemetry.runtime import command_event, session_event
from connector.timer import WALL_TIMER, Timer, WallTimer
from providers.base import ObservationSink, Provider, ProviderCapabilities, ProviderSession
from providers.registry import build_provider
from providers.simulated import Simulation

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
    mdns_interfaces: Sequence[str] | str | None = None  # addresses, "all", or None: the default route
    nats_url: str | None = None
    max_body_bytes: int = 65536
    host_policy: DeferredHostPolicy = field(default_factory=DeferredHostPolicy)
    host_retention_seconds: int = 7 * 24 * 3600
    host_poller: bool = True
    nats_service: str = "sensorium-os"
    # CONTRACT §15: the node name of a lab (None: the §10 subjects) and how to reach its NATS system.
    nats_node: str | None = None
    nats_access: BrokerAccess = field(default_factory=BrokerAccess)
    # Transports whose providers are simulated backends driven by `/v1/sim/...` (CONTRACT §13.1); never
    # default.
    simulate: tuple[Transport, ...] = ()


@dataclass(slots=True)
class Readiness:
    """What `/healthz` waits for (CONTRACT §9)."""

    catalog_verified: bool = False
    interrupted_marked: bool = False
    bus_required: bool = False
    bus_subscribed: bool = False

    @property
    def ready(self) -> bool:
        """True once every start-up duty is done."""
        bus_ok = self.bus_subscribed or not self.bus_required
        return self.catalog_verified and self.interrupted_marked and bus_ok

    def mark_bus_subscribed(self) -> None:
        """The Bus face subscribed to its subjects."""
        self.bus_subscribed = True


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
    host: HostService
    registry: DeferredRegistry
    telemetry: Telemetry
    simulation: Simulation | None = None


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


def provider_factory(
    config: ConnectorConfig, simulation: Simulation | None = None, timer: Timer = WALL_TIMER
) -> Callable[[str, str | None], Provider]:
    """A transport's provider: simulated, or replayed on `timer`, where configured; else the real one."""

    # A replay provider serves any number of sessions: parse each fixture once, not on every admission.
    replays: dict[str, Provider] = {}

    def build(transport: str, adapter: str | None) -> Provider:
        name: Transport = transport  # type: ignore[assignment]  # admitted scopes only name known transports
        simulated = None if simulation is None else simulation.provider(transport)
        if simulated is not None:
            return simulated
        replay = config.replay.get(transport)
        if replay is not None and transport in replays:
            return replays[transport]
        try:
            provider = build_provider(
                name,
                replay=replay,
                replay_speed=config.replay_speed,
                ble_adapter=adapter or config.ble_adapter,
                mdns_interfaces=config.mdns_interfaces,
                timer=timer,
            )
        except ProviderError as error:
            return _UnavailableProvider(name, error)
        if replay is not None:
            replays[transport] = provider
        return provider

    return build


@asynccontextmanager
async def assemble(
    config: ConnectorConfig,
    *,
    routers: Callable[[Assembled], Sequence[APIRouter]] = lambda _: (),
    clock: Callable[[], datetime] | None = None,
    providers: Callable[[str, str | None], Provider] | None = None,
    timer: Timer | None = None,
) -> AsyncIterator[Assembled]:
    """Open every part in dependency order; close them in reverse, sessions first (confirmed stops).

    `timer` drives the runtime's waits (a `VirtualTimer` in tests); the datetime clock is derived from it
    unless given. A clock alone shifts "now" while the waits stay real.
    """
    timer, clock = _time_sources(timer, clock)
    catalog = load_verified_catalog(
        config.catalog, trust_dir=config.trust_dir, data_dir=config.data_dir, now=clock()
    )
    readiness = Readiness(catalog_verified=True, bus_required=config.nats_url is not None)
    simulation = Simulation(config.simulate, timer) if config.simulate else None
    metrics = CollectorRegistry()
    telemetry = Telemetry(metrics)
    async with AsyncExitStack() as stack:
        state = await stack.enter_async_context(await ConnectorState.open(config.data_dir))
        commands, discovery = await _open_runtime(stack, config, state, telemetry, timer, clock)
        service = ConnectorService(
            catalog=catalog,
            principals=PrincipalDirectory(config.data_dir),
            discovery=discovery,
            commands=commands,
            state=state,
            providers=providers or provider_factory(config, simulation, timer),
            policy=config.host_policy,
            clock=clock,
        )
        _register_session_gauge(metrics, discovery)
        telemetry.watch_sessions(discovery.sessions)
        watchers = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(watchers.cancel_scope.cancel)  # runs first on exit, then the group is awaited
        watchers.start_soon(service.watch_principals)
        watchers.start_soon(service.sweep_metadata, config.host_retention_seconds)
        registry = await stack.enter_async_context(await DeferredRegistry.open(config.data_dir))
        host = _open_host(config, service, registry, metrics, clock)
        stack.callback(host.close)
        ended = await host.recover(clock())
        if ended:
            _log.info("marked %d host operations ended by the restart", len(ended))
        readiness.interrupted_marked = True
        if config.host_poller:
            await stack.enter_async_context(Poller(host, timer=timer))
        assembled = Assembled(
            config,
            catalog,
            service,
            discovery,
            commands,
            state,
            readiness,
            metrics,
            app=FastAPI(),
            host=host,
            registry=registry,
            telemetry=telemetry,
            simulation=simulation,
        )
        if config.nats_url is not None:
            await stack.enter_async_context(_open_bus(config, assembled, clock))
        assembled.app = create_app(
            service,
            ready=lambda: readiness.ready,
            metrics=metrics,
            routers=[*routers(assembled), *_simulation_routers(assembled)],
            max_body_bytes=config.max_body_bytes,
            telemetry=telemetry,
        )
        yield assembled


async def _open_runtime(
    stack: AsyncExitStack,
    config: ConnectorConfig,
    state: ConnectorState,
    telemetry: Telemetry,
    timer: Timer,
    clock: Callable[[], datetime],
) -> tuple[CommandRunner, DiscoveryManager]:
    """The command runner and the discovery runtime, on the one timer, once what a restart ended is marked."""
    commands = await stack.enter_async_context(
        CommandRunner(
            state,
            timer=timer,
            clock=clock,
            listener=lambda event, op: telemetry.emit(command_event(event, op)),
        )
    )
    interrupted = await commands.recover(clock())
    if interrupted:
        _log.info("marked %d interrupted command operations", len(interrupted))
    interrupted_scans, erased = await state.interrupt_discoveries(to_ms(clock()), format_ms(to_ms(clock())))
    if interrupted_scans:  # only what the restart changed: scans that were running when it came
        _log.info("marked %d running discovery operations interrupted by the restart", interrupted_scans)
    if erased:
        _log.info("erased %d retained scan results (memory only: the restart dropped them)", erased)
    discovery = await stack.enter_async_context(
        DiscoveryManager(
            timer=timer,
            journal=state,
            metadata_retention_seconds=config.host_retention_seconds,
            listener=lambda event, session: telemetry.emit(session_event(event, session)),
        )
    )
    return commands, discovery


def _time_sources(
    timer: Timer | None, clock: Callable[[], datetime] | None
) -> tuple[Timer, Callable[[], datetime]]:
    """The runtime's timer and the datetime clock, one derived from the other when only one is given."""
    if timer is not None:
        return timer, clock or (lambda: from_ms(timer.now_ms()))
    if clock is None or clock is wall_clock:
        return WALL_TIMER, wall_clock
    return WallTimer(lambda: to_ms(clock())), clock


def _simulation_routers(assembled: Assembled) -> list[APIRouter]:
    """The `/v1/sim/...` routes, only when `--simulate` is on (else they answer 404 `not-found`)."""
    if assembled.simulation is None:
        return []
    from connector.api.sim_routes import sim_router

    return [sim_router(assembled.simulation, assembled.service.authenticate)]


def _register_session_gauge(metrics: CollectorRegistry, discovery: DiscoveryManager) -> None:
    """Active discovery sessions, read at scrape time."""
    gauge = Gauge("sensorium_discovery_sessions_active", "Non-terminal discovery sessions", registry=metrics)
    gauge.set_function(lambda: float(discovery.active_count()))


def _open_host(
    config: ConnectorConfig,
    service: ConnectorService,
    registry: DeferredRegistry,
    metrics: CollectorRegistry,
    clock: Callable[[], datetime],
) -> HostService:
    """The reference host over this connector, its counters in the assembled metrics registry."""
    return HostService(
        service,
        registry,
        config.host_policy,
        clock,
        metrics=HostMetrics(metrics),
        retention=timedelta(seconds=config.host_retention_seconds),
    )


def _open_bus(config: ConnectorConfig, assembled: Assembled, clock: Callable[[], datetime]) -> BusAdapter:
    """The Bus face (CONTRACT §10); it connects in the background and marks readiness once subscribed."""
    assert config.nats_url is not None
    settings = BusSettings(
        url=config.nats_url,
        service=config.nats_service,
        retention_seconds=config.host_retention_seconds,
        node=config.nats_node,
        version=version(),
        metadata=None
        if config.nats_node is None
        else node_metadata(config.nats_node, version(), known_adapters(assembled)),
        access=config.nats_access,
    )
    return BusAdapter(
        settings,
        host=assembled.host,
        registry=assembled.registry,
        data_dir=config.data_dir,
        on_subscribed=assembled.readiness.mark_bus_subscribed,
        clock=clock,
    )


def known_adapters(assembled: Assembled) -> dict[str, str]:
    """The adapter each scannable transport uses when a directive names none (listed even while free)."""
    from connector.runtime.claims import DEFAULT_ADAPTER

    transports: set[str] = set()
    for action in assembled.catalog.actions.values():
        if action.discovery is not None:  # a discovery action (the catalog's own test in `discovery_profile`)
            transports.update(assembled.catalog.discovery_profile(action.action_id).transports)
    defaults = {"ble": assembled.config.ble_adapter or DEFAULT_ADAPTER}
    return {transport: defaults.get(transport, DEFAULT_ADAPTER) for transport in sorted(transports)}
