"""`sensorium-connector lab`: the federated operator view of a lab of nodes (CONTRACT §15)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import stat
import sys
from pathlib import Path
from typing import Any

import anyio

from connector.api.edge import HttpEdge
from connector.bus.node import check_access, check_node, parse_broker_urls
from connector.cli.main import EXIT_OK, DefaultsHelp, usage_error
from connector.cli.nats_flags import add_nats_access_flags, broker_access
from connector.cli.serve_cmd import http_server, listen
from connector.core.clock import wall_clock
from connector.core.lab import LabTable
from connector.lab.audit import AuditLog
from connector.lab.follower import LabFollower, LabSettings
from connector.lab.page import LabPage, lab_app
from connector.storage.files import make_private_dir
from connector.storage.principals import PrincipalDirectory
from connector.telemetry.logs import LOG_FORMAT_ENV, configure_logging

_log = logging.getLogger("sensorium.lab")


def register(subparsers: Any) -> None:
    """Add the `lab` command."""
    parser = subparsers.add_parser(
        "lab",
        help="run the federated operator view of a lab",
        description=(
            "Find the lab's nodes on the NATS system ($SRV.PING), list their operations with each node's "
            "operator token (the nodes FILE), follow their op.done, and serve /lab to the view's own "
            "operators. The view keeps no registry: only an append-only audit of the cancels it forwarded."
        ),
        formatter_class=DefaultsHelp,
    )
    parser.add_argument("--nats", required=True, metavar="URL[,URL...]", help="NATS URLs of the lab's system")
    parser.add_argument(
        "--nodes", required=True, type=Path, metavar="FILE", help='JSON {"<node>": "<operator token>"}, 0600'
    )
    parser.add_argument(
        "--data-dir", type=Path, default=Path(".sensorium-lab"), help="lab operators and the audit log"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8788, help="TCP port (0 picks a free one)")
    add_nats_access_flags(parser)
    parser.set_defaults(handler=run)


def read_nodes(path: Path) -> dict[str, str]:
    """The nodes FILE: owner-only (0600), a JSON object of node names to tokens; ValueError otherwise."""
    try:
        mode = os.stat(path).st_mode
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"--nodes: {error.strerror or type(error).__name__}") from None
    if stat.S_IMODE(mode) & 0o077:
        raise ValueError("--nodes FILE holds operator tokens: make it 0600 (chmod 600)")
    try:
        nodes = json.loads(text)
    except ValueError:
        raise ValueError("--nodes FILE is not JSON") from None
    if not isinstance(nodes, dict) or not all(isinstance(t, str) and t for t in nodes.values()):
        raise ValueError('--nodes FILE must be a JSON object {"<node>": "<operator token>"}')
    for name in nodes:
        check_node(name)
    return nodes


def run(args: argparse.Namespace) -> int:
    """Check the flags and the nodes FILE, then serve the view until SIGTERM/SIGINT."""
    configure_logging(os.environ.get(LOG_FORMAT_ENV, "text"), sys.stderr)
    try:
        urls = parse_broker_urls(args.nats)
        access = broker_access(args)
        check_access(urls, access)
        tokens = read_nodes(args.nodes)
        listener = listen(args.host, args.port)
    except (ValueError, OSError) as error:
        return usage_error(str(error))
    make_private_dir(args.data_dir)
    anyio.run(_serve, LabSettings(urls, access), tokens, args.data_dir, listener)
    return EXIT_OK


async def _serve(settings: LabSettings, tokens: dict[str, str], data_dir: Path, listener: Any) -> None:
    table = LabTable()
    follower = LabFollower(settings, tokens, table, wall_clock)
    page = LabPage(table, follower, PrincipalDirectory(data_dir), AuditLog(data_dir), wall_clock)
    server = http_server(lab_app(page), HttpEdge())  # the same read deadlines, cap and Host check (§8)
    host, port = listener.getsockname()[:2]
    async with anyio.create_task_group() as group:
        group.start_soon(follower.run)
        _log.info("lab serving on http://%s:%d/lab (%d nodes in the nodes file)", host, port, len(tokens))
        await server.serve(sockets=[listener])
        group.cancel_scope.cancel()
    await follower.close()
