"""`serve`'s trust, host policy and HTTP edge flags (CONTRACT §0, §3, §8, §12)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from connector.assembly import ConnectorConfig
from connector.catalog.keys import refuse_published_test_key
from connector.catalog.loader import MISSING, read_json_document
from connector.core.policy import DeferredHostPolicy, PolicyError
from connector.errors import CatalogError
from connector.resources import example_catalog, example_trust


def add_edge_arguments(parser: argparse.ArgumentParser) -> None:
    """Trust, host policy and the hosts the HTTP edge answers for (CONTRACT §3, §8, §12)."""
    parser.add_argument(
        "--allow-test-key",
        action="store_true",
        help="start although the trust directory holds the published test key (tests and demos only: "
        "anyone can sign with it)",
    )
    defaults = ", ".join(f"{f.name}={f.default}" for f in dataclasses.fields(DeferredHostPolicy))
    parser.add_argument(
        "--host-policy",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"JSON object overriding host policy fields (defaults: {defaults})",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name the HTTP API answers for besides IP literals and localhost (others get 421); "
        "repeatable",
    )


def host_policy_from(path: Path | None) -> DeferredHostPolicy:
    """The default policy, or the one of `--host-policy FILE`; ValueError naming the refused keys."""
    if path is None:
        return DeferredHostPolicy()
    try:
        document = read_json_document(path, missing_code=MISSING)  # strict: no duplicate keys, no NaN
    except CatalogError as error:
        raise ValueError(f"--host-policy: {error.message}") from None
    if not isinstance(document, dict):
        raise ValueError(f"--host-policy {path}: must hold a JSON object of host policy fields")
    try:
        return DeferredHostPolicy.from_mapping(document)
    except PolicyError as error:
        refused = "; ".join(f"{d['message'].lstrip('/')} ({d['code']})" for d in error.diagnostics)
        raise ValueError(f"--host-policy {path}: refused {refused}") from None


def check_trust(args: argparse.Namespace, config: ConnectorConfig) -> None:
    """`catalog-test-key` unless allowed or `--simulate` serves the packaged example (CONTRACT §0, §12)."""
    packaged = config.catalog.resolve() == example_catalog().resolve()
    packaged = packaged and config.trust_dir.resolve() == example_trust().resolve()
    if getattr(args, "allow_test_key", False) or (config.simulate and packaged):
        return
    refuse_published_test_key(config.trust_dir)
