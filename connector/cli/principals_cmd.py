"""`principals add | revoke | list`: manage bearer-token principals in `<data-dir>/principals.json`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from connector.catalog.loader import MISSING, read_json_document
from connector.cli.main import EXIT_OK, usage_error
from connector.core.authority import Grant, format_grant, parse_grant_spec
from connector.errors import CatalogError, SensoriumError
from connector.storage.principals import add_principal, list_principals, revoke

DEFAULT_DATA_DIR = Path(".sensorium")
DEFAULT_CATALOG = Path("catalog/actions.json")


def register(subparsers: Any) -> None:
    """Add the `principals` command and its three subcommands."""
    parser = subparsers.add_parser("principals", help="manage bearer-token principals")
    actions = parser.add_subparsers(dest="principals_command", required=True)

    add = actions.add_parser("add", help="create a principal and print its bearer token once")
    _data_dir_option(add)
    add.add_argument("--id", dest="principal_id", required=True, help="principal id")
    add.add_argument("--role", required=True, help="caller or operator")
    add.add_argument(
        "--grant",
        action="append",
        default=[],
        metavar="ACTION[:TRANSPORT,...]",
        help="allow an action, optionally only on some transports; repeatable",
    )
    add.add_argument(
        "--catalog",
        type=Path,
        default=None,
        metavar="FILE",
        help="refuse grants for actions this catalog lacks (without it: a warning, checked against "
        f"{DEFAULT_CATALOG} when present)",
    )
    add.set_defaults(handler=_add)

    rev = actions.add_parser("revoke", help="revoke one grant, or the whole principal")
    _data_dir_option(rev)
    rev.add_argument("--id", dest="principal_id", required=True, help="principal id")
    rev.add_argument("--grant", default=None, metavar="ACTION", help="revoke only this action's grant")
    rev.set_defaults(handler=_revoke)

    show = actions.add_parser("list", help="list principals (no secrets)")
    _data_dir_option(show)
    show.set_defaults(handler=_list)


def _data_dir_option(parser: argparse.ArgumentParser) -> None:
    """`--data-dir D` (default `./.sensorium`, like `serve`)."""
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="data directory")


def _add(args: argparse.Namespace) -> int:
    """Create the principal; the token is printed alone on the last line of stdout."""
    try:
        grants = [parse_grant_spec(spec) for spec in args.grant]
        unknown = _unknown_actions(grants, args.catalog or DEFAULT_CATALOG)
        if unknown and args.catalog is not None:
            return usage_error(
                f"principals add: {args.catalog} has no action {', '.join(unknown)}; nothing was created"
            )
        token = add_principal(args.data_dir, args.principal_id, args.role, grants)
    except SensoriumError as error:
        return usage_error(error.message)
    if unknown:
        print(
            f"sensorium-connector: warning: {DEFAULT_CATALOG} has no action {', '.join(unknown)}; "
            "the grant was kept (pass --catalog FILE to refuse it)",
            file=sys.stderr,
        )
    elif grants and args.catalog is None and not DEFAULT_CATALOG.is_file():
        print(
            "sensorium-connector: warning: the grants were not checked against a catalog "
            f"({DEFAULT_CATALOG} is absent; pass --catalog FILE)",
            file=sys.stderr,
        )
    print(f"created principal {args.principal_id} ({args.role}); its bearer token is shown once, below:")
    print(token)
    return EXIT_OK


def _revoke(args: argparse.Namespace) -> int:
    """Revoke one grant or the whole principal."""
    try:
        lost = revoke(args.data_dir, args.principal_id, args.grant)
    except SensoriumError as error:
        return usage_error(error.message)
    if args.grant:
        print(f"revoked the grant for {args.grant} of principal {args.principal_id}")
    else:
        held = f"; it held {', '.join(sorted(lost))}" if lost else ""
        print(f"revoked principal {args.principal_id}: its token no longer authenticates{held}")
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    """One line per principal: id, role, state, grants; never a token or hash."""
    try:
        principals = list_principals(args.data_dir)
    except SensoriumError as error:
        return usage_error(error.message)
    print("id\trole\tstate\tgrants")
    for principal in principals:
        state = "revoked" if principal.revoked else "active"
        grants = " ".join(format_grant(grant) for grant in principal.grants) or "-"
        print(f"{principal.principal_id}\t{principal.role}\t{state}\t{grants}")
    return EXIT_OK


def _unknown_actions(grants: Sequence[Grant], catalog: Path) -> list[str]:
    """Granted action ids the catalog does not hold (none when there is no catalog file to read)."""
    if not catalog.is_file():
        return []
    try:
        document = read_json_document(catalog, missing_code=MISSING)
    except CatalogError as error:
        raise SensoriumError(f"principals add: cannot read the catalog: {error.message}") from None
    actions = document.get("actions") if isinstance(document, dict) else None
    entries = actions if isinstance(actions, list) else []
    known = {entry.get("action_id") for entry in entries if isinstance(entry, dict)}
    return sorted({grant.action_id for grant in grants} - known)
