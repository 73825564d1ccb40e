"""`sensorium-connector ops watch|get|cancel|start`: Bus operations from the terminal (CONTRACT §10, 12).

`ops watch OP` exits with the code of the operation's terminal state: 0 `done`, 1 `failed` or `lost`,
130 `cancelled` (a confirmed stop, as CONTRACT §12 uses 130), 2 for a usage error, an unreachable broker or a
refused request. Ctrl-C stops watching (the operation goes on) and exits 130.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio

from connector.bus.client import DEFAULT_URL, BusClient, BusRefused
from connector.bus.messages import DEFAULT_SERVICE, Subjects, check_broker_url, is_valid_op
from connector.cli.main import EXIT_CANCELLED, EXIT_FAILED, EXIT_OK, EXIT_USAGE, usage_error

TOKEN_ENV = "SENSORIUM_TOKEN"
EXIT_BY_STATE: Mapping[str, int] = {
    "done": EXIT_OK,
    "failed": EXIT_FAILED,
    "lost": EXIT_FAILED,
    "cancelled": EXIT_CANCELLED,
}


Work = Callable[[BusClient], Awaitable[int]]


class _Unreachable(Exception):
    """The broker could not be reached within the connect timeout."""


def register(subparsers: Any) -> None:
    """Add the `ops` command and its subcommands."""
    parser = subparsers.add_parser("ops", help="Bus operations: watch, get, cancel, start")
    actions = parser.add_subparsers(dest="ops_command", required=True)
    watch = actions.add_parser(
        "watch",
        help="print an operation's state changes; exit with its outcome",
        epilog="exit codes: 0 done, 1 failed or lost, 130 cancelled (or Ctrl-C: the operation goes on), "
        "2 usage error, unreachable broker or refused request",
    )
    watch.add_argument("op", help="the Bus handle (the caller's own op, or the operation id)")
    watch.add_argument("--poll", type=float, default=10.0, metavar="SECONDS", help="op.get interval")
    watch.add_argument("--json", action="store_true", help="print each envelope as one JSON line")
    _common(watch)
    watch.set_defaults(handler=run_watch)
    for name, help_text in (("get", "print an operation's envelope"), ("cancel", "ask an operation to stop")):
        sub = actions.add_parser(name, help=help_text)
        sub.add_argument("op")
        _common(sub)
        sub.set_defaults(handler=run_request)
    start = actions.add_parser("start", help="start an operation from a directive file")
    start.add_argument("--directive", type=Path, required=True, metavar="FILE")
    start.add_argument("--op", default=None, help="your own handle (a retry joins the same work)")
    _common(start)
    start.set_defaults(handler=run_request)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nats", default=DEFAULT_URL, metavar="URL", help=f"broker (default {DEFAULT_URL})")
    parser.add_argument(
        "--token-file", type=Path, default=None, metavar="FILE", help=f"bearer token (default: ${TOKEN_ENV})"
    )
    parser.add_argument("--service", default=DEFAULT_SERVICE, metavar="NAME", help="Bus subject prefix")
    parser.add_argument("--connect-timeout", type=float, default=10.0, metavar="SECONDS")
    parser.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS", help="per request")


def _token(args: argparse.Namespace) -> str:
    """The bearer token from `--token-file` (first line) or `SENSORIUM_TOKEN`; ValueError otherwise."""
    if args.token_file is not None:
        try:
            lines = args.token_file.read_text(encoding="utf-8").splitlines()
        except OSError:
            raise ValueError("--token-file is not a readable file") from None
        token = lines[0].strip() if lines else ""
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise ValueError(f"no bearer token: pass --token-file FILE or set {TOKEN_ENV}")
    return token


def _check(args: argparse.Namespace) -> str:
    """Validate the shared options; answer the token."""
    Subjects.for_service(args.service)
    check_broker_url(args.nats)
    op = getattr(args, "op", None)
    if op is not None and not is_valid_op(op):
        raise ValueError("OP must be 1-128 characters of [A-Za-z0-9._:/-], starting alphanumeric")
    if args.connect_timeout <= 0 or args.timeout <= 0 or getattr(args, "poll", 1.0) <= 0:
        raise ValueError("timeouts and --poll must be greater than 0")
    return _token(args)


def run_watch(args: argparse.Namespace) -> int:
    """Follow one operation until a terminal state; exit with that state's code."""
    try:
        token = _check(args)
    except ValueError as error:
        return usage_error(f"ops watch: {error}")
    return _bridge(args, token, lambda client: _watch(client, args))


def run_request(args: argparse.Namespace) -> int:
    """`get`, `cancel` or `start`: print the reply as JSON."""
    try:
        token = _check(args)
        directive = _directive(args.directive) if args.ops_command == "start" else None
    except ValueError as error:
        return usage_error(f"ops {args.ops_command}: {error}")
    return _bridge(args, token, lambda client: _request(client, args, directive))


def _directive(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise ValueError("--directive is not a readable JSON file") from None


def _bridge(args: argparse.Namespace, token: str, work: Work) -> int:
    """The one sync-to-async bridge of this command: connect, work, map failures to exit codes."""
    try:
        return anyio.run(_connected, args, token, work)
    except KeyboardInterrupt:
        print("sensorium-connector: ops: interrupted; the operation itself goes on", file=sys.stderr)
        return EXIT_CANCELLED
    except _Unreachable:
        return usage_error(f"ops {args.ops_command}: cannot reach the broker at the --nats URL")
    except BusRefused as error:
        return usage_error(f"ops {args.ops_command}: refused ({error.code}): {error.message}")
    except TimeoutError:
        return usage_error(f"ops {args.ops_command}: no answer from the service within --timeout")


async def _connected(args: argparse.Namespace, token: str, work: Work) -> int:
    connect = BusClient.connect(
        args.nats,
        token=token,
        service=args.service,
        timeout=args.timeout,
        connect_timeout=min(args.connect_timeout, 2.0),
    )
    with anyio.move_on_after(args.connect_timeout) as connecting:
        client = await connect.__aenter__()
    if connecting.cancelled_caught:
        raise _Unreachable
    try:
        return await work(client)
    finally:
        await connect.__aexit__(None, None, None)


async def _watch(client: BusClient, args: argparse.Namespace) -> int:
    code = EXIT_FAILED
    async for change in client.watch(args.op, poll_interval=args.poll):
        _print_change(change, as_json=args.json)
        code = EXIT_BY_STATE.get(change["state"], code)
    return code


def _print_change(change: Mapping[str, Any], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(change, separators=(",", ":"), ensure_ascii=False), flush=True)
        return
    reason = f" ({change['reason']})" if change.get("reason") else ""
    print(f"{change['state']}{reason}", flush=True)


async def _request(client: BusClient, args: argparse.Namespace, directive: Any) -> int:
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeout

    try:
        if args.ops_command == "start":
            reply = await client.start(directive, op=args.op)
        elif args.ops_command == "cancel":
            reply = await client.cancel(args.op)
        else:
            reply = await client.get(args.op)
    except (NatsTimeout, NoRespondersError):
        raise TimeoutError from None
    print(json.dumps(reply, indent=2, ensure_ascii=False))
    return EXIT_OK


__all__ = ["EXIT_USAGE", "register", "run_request", "run_watch"]
