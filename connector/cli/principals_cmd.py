"""`principals add | revoke | list`: manage bearer-token principals in `<data-dir>/principals.json`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from connector.cli.main import EXIT_OK, usage_error
from connector.core.authority import format_grant, parse_grant_spec
from connector.errors import SensoriumError
from connector.storage.principals import add_principal, list_principals, revoke

DEFAULT_DATA_DIR = Path(".sensorium")


def register(subparsers: Any) -> None:
    """Add the `principals` command and its three subcommands."""
    parser = subparsers.add_parser("principals", help="manage bearer-token principals")
    actions = parser.add_subparsers(dest="principals_command", required=True)

    add = actions.add_parser("add", help="create a principal and print its bearer token once")
    _data_dir_option(add)
    add.add_argument("--id", dest="principal_id", required=True, help="principal id")
    add.add_argument("--role", required=True, help="caller or operator")
    add.add_argument("--grant", action="append", default=[], metavar="ACTION[:TRANSPORT,...]")
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
        token = add_principal(args.data_dir, args.principal_id, args.role, grants)
    except SensoriumError as error:
        return usage_error(error.message)
    print(f"created principal {args.principal_id} ({args.role}); its bearer token is shown once, below:")
    print(token)
    return EXIT_OK


def _revoke(args: argparse.Namespace) -> int:
    """Revoke one grant or the whole principal."""
    try:
        lost = revoke(args.data_dir, args.principal_id, args.grant)
    except SensoriumError as error:
        return usage_error(error.message)
    what = "grant " + args.grant if args.grant else "principal"
    print(f"revoked {what} of {args.principal_id} ({len(lost)} action(s) lost)")
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    """One line per principal: id, role, state, grants; never a token or hash."""
    try:
        principals = list_principals(args.data_dir)
    except SensoriumError as error:
        return usage_error(error.message)
    for principal in principals:
        state = "revoked" if principal.revoked else "active"
        grants = " ".join(format_grant(grant) for grant in principal.grants) or "-"
        print(f"{principal.principal_id}\t{principal.role}\t{state}\t{grants}")
    return EXIT_OK
