"""`sensorium-connector serve`: connector, reference host, poller and console in one process."""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from prometheus_client import CollectorRegistry

from connector.api.console import console_router
from connector.api.edge import HostCheck, HttpEdge, allowed_host_names, edge_protocol, watch_connections
from connector.api.host_routes import host_router
from connector.assembly import Assembled, ConnectorConfig, assemble, known_adapters
from connector.bus.messages import Subjects
from connector.bus.node import check_access, check_node, parse_broker_urls
from connector.bus.probe import NodeTaken, refuse_live_node
from connector.cli.main import EXIT_OK, EXIT_USAGE, DefaultsHelp, usage_error
from connector.cli.nats_flags import add_nats_access_flags, broker_access
from connector.cli.serve_flags import add_edge_arguments, check_trust, host_policy_from
from connector.contract.transports import TRANSPORTS
from connector.errors import CatalogError
from connector.resources import example_catalog, example_trust
from connector.service.operations import LiveConnectorOperations
from connector.storage.files import make_private_dir
from connector.telemetry.logs import LOG_FORMAT_ENV, LOG_FORMATS, configure_logging
from providers.replay import FixtureError, load_fixture
from providers.simulated import parse_simulate

_log = logging.getLogger("sensorium.serve")
PACKAGED_NOTE = (
    "serve --simulate: using the packaged example catalog and its published test key "
    "(a test mode: anyone can sign with that key; give --catalog and --trust to serve your own)"
)


class _Server(uvicorn.Server):
    """uvicorn that turns SIGTERM/SIGINT into a graceful exit and does not re-raise the signal afterwards.

    uvicorn re-raises a captured signal once it has shut down; the default handler would then kill the
    process before discovery sessions are stopped with confirmed cleanup.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Install uvicorn's exit handler for the duration of `serve`, then restore the previous ones."""
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def register(subparsers: Any) -> None:
    """Add the `serve` command."""
    parser = subparsers.add_parser(
        "serve",
        help="run the connector service",
        description=(
            "Run the connector, the reference host, its poller and the operator console in one process, "
            "with embedded SQLite state under --data-dir. Stops on SIGTERM or Ctrl-C after every running "
            "scan confirmed its stop."
        ),
        formatter_class=DefaultsHelp,
    )
    parser.add_argument("--data-dir", type=Path, default=Path(".sensorium"), help="state directory")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8787, help="TCP port (0 picks a free one)")
    parser.add_argument(
        "--catalog",
        type=Path,
        default=None,
        help="signed action catalog (default: catalog/actions.json; with --simulate: the packaged example)",
    )
    parser.add_argument(
        "--trust",
        type=Path,
        default=None,
        help="trusted operator keys (default: catalog/trust; --simulate without --catalog: the packaged key)",
    )
    parser.add_argument(
        "--replay",
        action="append",
        default=[],
        metavar="TRANSPORT=FILE",
        help="play an hw-fixtures file instead of real hardware for TRANSPORT (ble, usb-serial, mdns); "
        "repeatable",
    )
    parser.add_argument(
        "--replay-speed", type=float, default=1.0, metavar="X", help="replay at X times recorded speed"
    )
    parser.add_argument(
        "--simulate",
        nargs="?",
        const="all",
        default=None,
        metavar="T[,T...]",
        help="simulated backends driven by the operator routes /v1/sim/... for the named transports "
        "(bare: all three); for mock-device CI, never for production",
    )
    parser.add_argument(
        "--nats", default=None, metavar="URL[,URL...]", help="NATS URLs of one system for the Bus face"
    )
    parser.add_argument(
        "--node", default=None, metavar="NAME", help="this host's node name in a lab (CONTRACT §15)"
    )
    add_nats_access_flags(parser)
    parser.add_argument("--nats-service", default="sensorium-os", metavar="NAME", help="Bus subject prefix")
    parser.add_argument(
        "--mdns-interfaces",
        default=None,
        metavar="IP[,IP...]|all",
        help="interfaces mDNS queries go to, or all (default: the interface of the default route)",
    )
    parser.add_argument(
        "--ble-adapter",
        default=None,
        metavar="NAME",
        help="BLE adapter for directives that name none (default: the first powered adapter)",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=None,
        help=f"log lines as plain text or JSON Lines (default: ${LOG_FORMAT_ENV}, else text)",
    )
    add_edge_arguments(parser)
    parser.set_defaults(handler=run)


def parse_replays(values: list[str]) -> dict[str, Path]:
    """`TRANSPORT=FILE` pairs; ValueError with a one-line reason otherwise."""
    replays: dict[str, Path] = {}
    for value in values:
        transport, sep, path = value.partition("=")
        if not sep or transport not in TRANSPORTS or not path:
            raise ValueError("--replay takes TRANSPORT=FILE with TRANSPORT one of ble, usb-serial, mdns")
        try:
            fixture = load_fixture(path)  # the file and every line checked now, not at the first scan
        except FixtureError as error:
            raise ValueError(f"--replay {transport}={path}: {_fixture_reason(path, error)}") from None
        if fixture.transport != transport:
            recorded = fixture.transport
            raise ValueError(f"--replay {transport}={path}: the fixture records {recorded}, not {transport}")
        replays[transport] = Path(path)
    return replays


def _fixture_reason(path: str, error: FixtureError) -> str:
    """The OS reason for an unreadable file, else the fixture rule that was broken (line and path)."""
    try:
        with open(path, "rb"):
            pass
    except OSError as os_error:
        return os_error.strerror or type(os_error).__name__
    return error.message


def config_from(args: argparse.Namespace) -> ConnectorConfig:
    """The process configuration from parsed arguments."""
    interfaces = None if args.mdns_interfaces is None else _mdns_interfaces(args.mdns_interfaces)
    if args.replay_speed <= 0:
        raise ValueError("--replay-speed must be greater than 0")
    replays = parse_replays(args.replay)
    chosen = getattr(args, "simulate", None)  # namespaces built by hand may predate the flag
    simulate = () if chosen is None else parse_simulate(chosen)
    both = sorted(set(replays) & set(simulate))
    if both:
        raise ValueError(f"--replay and --simulate both name {', '.join(both)}: choose one per transport")
    catalog, trust = catalog_paths(args.catalog, args.trust, simulate)
    return ConnectorConfig(
        data_dir=args.data_dir,
        catalog=catalog,
        trust_dir=trust,
        replay=replays,
        replay_speed=args.replay_speed,
        simulate=simulate,
        ble_adapter=args.ble_adapter,
        mdns_interfaces=interfaces,
        nats_service=_nats_service(args.nats_service),
        host_policy=host_policy_from(getattr(args, "host_policy", None)),
        **_lab_node(args),
    )


def _lab_node(args: argparse.Namespace) -> dict[str, Any]:
    """The Bus URLs, the node name and the broker access (CONTRACT §15); ValueError with a reason."""
    nats, node = getattr(args, "nats", None), getattr(args, "node", None)
    if nats is None:
        if node is not None:
            raise ValueError("--node needs --nats")
        return {"nats_url": None}
    urls = parse_broker_urls(nats)
    access = broker_access(args)
    check_access(urls, access)
    return {
        "nats_url": ",".join(urls),
        "nats_node": None if node is None else check_node(node),
        "nats_access": access,
    }


def catalog_paths(catalog: Path | None, trust: Path | None, simulate: tuple[str, ...]) -> tuple[Path, Path]:
    """The catalog and trust directory: as given, else `catalog/`; `--simulate` without `--catalog` serves
    the packaged example with its packaged key and never reads `./catalog/` (CONTRACT §0)."""
    if catalog is None and simulate:
        if trust is not None:
            raise ValueError("--trust needs --catalog: --simulate alone serves the packaged example catalog")
        return example_catalog(), example_trust()
    return catalog or Path("catalog/actions.json"), trust or Path("catalog/trust")


def _mdns_interfaces(text: str) -> tuple[str, ...] | str:
    """`IP[,IP...]` or `all`; ValueError with a one-line reason otherwise."""
    from providers.mdns_interfaces import parse_setting

    try:
        return parse_setting(text)
    except ValueError:
        raise ValueError("--mdns-interfaces takes IP addresses separated by commas, or all") from None


def _nats_service(name: str) -> str:
    """A Bus service name usable as a subject prefix; ValueError otherwise."""
    Subjects.for_service(name)
    return name


def run(args: argparse.Namespace) -> int:
    """Bind, serve until SIGTERM/SIGINT, stop every session with confirmed cleanup, exit."""
    log_format = args.log_format or os.environ.get(LOG_FORMAT_ENV, "text")
    if log_format not in LOG_FORMATS:
        return usage_error(f"{LOG_FORMAT_ENV} must be one of {', '.join(LOG_FORMATS)}")
    configure_logging(log_format, sys.stderr)
    try:
        config = config_from(args)
        edge = HttpEdge(allowed_hosts=allowed_host_names(args.allowed_host))
        check_trust(args, config)
        if config.simulate and args.catalog is None:
            _log.warning(PACKAGED_NOTE)  # a log line: one JSON object with --log-format json
        listener = listen(args.host, args.port)
    except CatalogError as error:
        return _catalog_refused(error)
    except (ValueError, OSError) as error:
        return usage_error(str(error))
    try:
        anyio.run(_serve, config, listener, edge)
    except CatalogError as error:
        return _catalog_refused(error)
    except NodeTaken as error:
        return usage_error(str(error))
    return EXIT_OK


def _catalog_refused(error: CatalogError) -> int:
    return usage_error(f"catalog refused ({error.code}): {error.message}")


def listen(host: str, port: int) -> socket.socket:
    """The bound listener; sockets it accepts have TCP_NODELAY."""
    listener = socket.create_server((host, port), reuse_port=False)
    # Accepted sockets inherit it: uvicorn writes headers and body separately (no Nagle delay).
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return listener


def http_server(app: Any, edge: HttpEdge, metrics: CollectorRegistry | None = None) -> uvicorn.Server:
    """uvicorn over `app` with the edge's deadlines, connection cap and `Host` check (CONTRACT §8).

    With `metrics`, the open-connection gauge of the edge is registered there (`serve`: the `/metrics` one).
    """
    # log_config=None: uvicorn's own records go through our handler (text or JSON Lines) like every other.
    config = uvicorn.Config(
        HostCheck(app, edge.allowed_hosts),
        http=edge_protocol(edge),
        timeout_keep_alive=edge.keep_alive_seconds,
        log_level="warning",
        lifespan="off",
        log_config=None,
    )
    server = _Server(config)
    if metrics is not None:
        watch_connections(server.server_state, metrics)
    return server


async def _serve(config: ConnectorConfig, listener: socket.socket, edge: HttpEdge) -> None:
    make_private_dir(config.data_dir)
    if config.nats_url is not None and config.nats_node is not None:
        await refuse_live_node(config.nats_url, config.nats_service, config.nats_node, config.nats_access)
    async with assemble(config, routers=extra_routers) as assembled:
        freeze_startup_heap()
        host, port = listener.getsockname()[:2]
        server = http_server(assembled.app, edge, assembled.metrics)
        _log.info(
            "serving on http://%s:%d (catalog %s v%d)",
            host,
            port,
            assembled.catalog.catalog_id,
            assembled.catalog.version,
        )
        if assembled.simulation is not None:
            _log.warning("simulated backends for %s: driven by /v1/sim/...", ", ".join(config.simulate))
        await server.serve(sockets=[listener])
        _log.info("shutting down: stopping sessions with confirmed cleanup")
    _log.info("stopped")


def freeze_startup_heap() -> None:
    """Move what start-up built (modules, schemas, catalog, app: ~90,000 objects) out of the collector's walk.

    It lives as long as the process; left in the oldest generation, every full collection walked it
    again (50-200 ms with the event loop stopped: a poll's p99), while only what requests and sessions
    allocate can become garbage.
    """
    gc.collect()
    gc.freeze()


def extra_routers(assembled: Assembled) -> list[Any]:
    """Routers the reference host and console add."""
    operations = LiveConnectorOperations(
        assembled.discovery, assembled.state, known_adapters=known_adapters(assembled)
    )
    return [
        host_router(assembled.host),
        console_router(
            assembled.host,
            authenticate=assembled.service.authenticate,
            operations=operations,
            backends=backends_of(assembled.config),
        ),
    ]


def backends_of(config: ConnectorConfig) -> dict[str, str]:
    """Transports that are not real hardware, for the console's banner."""
    return {**{t: "replayed" for t in config.replay}, **{t: "simulated" for t in config.simulate}}


__all__ = ["EXIT_OK", "EXIT_USAGE", "known_adapters", "register", "run"]
