"""The broker access flags `serve` and `lab` share (CONTRACT §15)."""

from __future__ import annotations

import argparse
from pathlib import Path

from connector.bus.node import BrokerAccess


def add_nats_access_flags(parser: argparse.ArgumentParser) -> None:
    """`--nats-creds FILE`, `--nats-tls-ca FILE`, `--nats-insecure`."""
    parser.add_argument(
        "--nats-creds", type=Path, default=None, metavar="FILE", help="NATS .creds file or nkey seed file"
    )
    parser.add_argument(
        "--nats-tls-ca", type=Path, default=None, metavar="FILE", help="CA certificate of the NATS servers"
    )
    parser.add_argument(
        "--nats-insecure",
        action="store_true",
        help="allow a NATS URL that is not loopback without credentials and TLS",
    )


def broker_access(args: argparse.Namespace) -> BrokerAccess:
    """The parsed access flags (absent ones as defaults, for namespaces built by hand)."""
    return BrokerAccess(
        creds=getattr(args, "nats_creds", None),
        tls_ca=getattr(args, "nats_tls_ca", None),
        insecure=bool(getattr(args, "nats_insecure", False)),
    )
