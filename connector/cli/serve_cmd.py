"""`sensorium-connector serve`: connector, reference host, poller and console in one process."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import uvicorn

from connector.api.console import console_router
from connector.bus.messages import Subjects, check_broker_url
from connector.cli.main import EXIT_OK, EXIT_USAGE, usage_error
from connector.errors import CatalogError
from connector.host.routes import host_router
from connector.service.assembly import Assembled, ConnectorConfig, assemble
from connector.storage.files import make_private_dir

_log = logging.getLogger("sensorium.serve")


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
    parser = subparsers.add_parser("serve", help="run the connector service")
    parser.add_argument("--data-dir", type=Path, default=Path(".sensorium"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8787)
    parser.add_argument("--catalog", type=Path, default=Path("catalog/actions.json"))
    parser.add_argument("--trust", type=Path, default=Path("catalog/trust"))
    parser.add_argument("--replay", action="append", default=[], metavar="TRANSPORT=FILE")
    parser.add_argument("--replay-speed", type=float, default=1.0)
    parser.add_argument("--nats", default=None, metavar="URL")
    parser.add_argument("--nats-service", default="sensorium-os", metavar="NAME", help="Bus subject prefix")
    parser.add_argument("--mdns-interfaces", default=None, metavar="IP[,IP...]|all")
    parser.add_argument("--ble-adapter", default=None)
    parser.set_defaults(handler=run)


def parse_replays(values: list[str]) -> dict[str, Path]:
    """`TRANSPORT=FILE` pairs; ValueError with a one-line reason otherwise."""
    replays: dict[str, Path] = {}
    for value in values:
        transport, sep, path = value.partition("=")
        if not sep or transport not in ("ble", "usb-serial", "mdns") or not path:
            raise ValueError("--replay takes TRANSPORT=FILE with TRANSPORT one of ble, usb-serial, mdns")
        if not Path(path).is_file():
            raise ValueError(f"--replay fixture for {transport} is not a readable file")
        replays[transport] = Path(path)
    return replays


def config_from(args: argparse.Namespace) -> ConnectorConfig:
    """The process configuration from parsed arguments."""
    interfaces = None if args.mdns_interfaces is None else _mdns_interfaces(args.mdns_interfaces)
    if args.replay_speed <= 0:
        raise ValueError("--replay-speed must be greater than 0")
    return ConnectorConfig(
        data_dir=args.data_dir,
        catalog=args.catalog,
        trust_dir=args.trust,
        replay=parse_replays(args.replay),
        replay_speed=args.replay_speed,
        ble_adapter=args.ble_adapter,
        mdns_interfaces=interfaces,
        nats_url=None if args.nats is None else check_broker_url(args.nats),
        nats_service=_nats_service(args.nats_service),
    )


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
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = config_from(args)
        listener = socket.create_server((args.host, args.port), reuse_port=False)
        # Accepted sockets inherit it: uvicorn writes headers and body separately (no Nagle delay).
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (ValueError, OSError) as error:
        return usage_error(str(error))
    try:
        anyio.run(_serve, config, listener)
    except CatalogError as error:
        return usage_error(f"catalog refused ({error.code}): {error.message}")
    return EXIT_OK


async def _serve(config: ConnectorConfig, listener: socket.socket) -> None:
    make_private_dir(config.data_dir)
    async with assemble(config, routers=extra_routers) as assembled:
        host, port = listener.getsockname()[:2]
        server = _Server(uvicorn.Config(assembled.app, log_level="warning", lifespan="off"))
        _log.info(
            "serving on http://%s:%d (catalog %s v%d)",
            host,
            port,
            assembled.catalog.catalog_id,
            assembled.catalog.version,
        )
        await server.serve(sockets=[listener])
        _log.info("shutting down: stopping sessions with confirmed cleanup")
    _log.info("stopped")


def extra_routers(assembled: Assembled) -> list[Any]:
    """Routers the reference host and console add."""
    return [
        host_router(assembled.host),
        console_router(assembled.host, authenticate=assembled.service.authenticate),
    ]


__all__ = ["EXIT_OK", "EXIT_USAGE", "register", "run"]
