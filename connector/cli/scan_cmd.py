"""`sensorium-connector scan`: one bounded scan from the terminal, through the same runtime as `serve`.

Exit codes: 0 completed; 1 failed, timed-out or expired (also a Ctrl-C whose stop was not confirmed);
2 usage or input error, catalog refusal included, with a one-line reason on stderr; 130 a scan cancelled
by Ctrl-C whose stop was confirmed.
"""

from __future__ import annotations

import argparse
import json
import secrets
import signal
import sys
import types
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import anyio
from anyio.abc import TaskStatus
from rich.console import Console
from rich.live import Live

from connector.cli.live_view import (
    SignalHistory,
    candidate_table,
    candidates_of,
    render_live,
    revision_of,
)
from connector.cli.main import EXIT_CANCELLED, EXIT_FAILED, EXIT_OK, DefaultsHelp, usage_error
from connector.cli.scan_help import explain_refusal, filter_epilog, provider_hint
from connector.contract.transports import TRANSPORTS, Transport
from connector.core.authority import Principal
from connector.core.clock import wall_clock
from connector.core.transports import TRANSPORT_FACTS
from connector.errors import AdmissionError, CatalogError, Code, ProviderUnavailable, SensoriumError

if TYPE_CHECKING:
    from connector.catalog.signing import VerifiedCatalog
    from connector.core.admission import SessionSpec
    from connector.core.scope import DiscoveryProfile, DiscoveryScope
    from connector.runtime.manager import DiscoveryManager
    from providers.base import Provider

SCAN_ACTION = "device.discovery.scan"
OWNER = "cli"
# The operator at the terminal: admitted like any directive, but it holds no caller grants to check.
OPERATOR = Principal(principal_id=OWNER, role="operator", token_sha256="0" * 64)
# Seconds the live view waits for a new revision before it redraws the progress bar anyway.
_REDRAW_S = 0.25
# Slack on top of window + stop bound before the bridge gives up on a scan that never terminates.
_BRIDGE_SLACK_S = 10.0


@dataclass(frozen=True, slots=True)
class ScanPlan:
    """Everything a scan needs, resolved before the event loop starts."""

    spec: SessionSpec
    provider: Provider
    json_output: bool
    notes: tuple[str, ...] = ()  # stderr lines shown under the "scanning" line

    @property
    def scope(self) -> DiscoveryScope:
        """The admitted scope."""
        return self.spec.scope


@dataclass(slots=True)
class _Outcome:
    """What the scan ended with, and whether Ctrl-C asked for it."""

    status: dict[str, Any] | None = None
    interrupted: bool = False
    # The candidates of the last live table (memory only): what a Ctrl-C leaves on the screen.
    last_candidates: list[dict[str, Any]] | None = None
    history: SignalHistory | None = None


def register(subparsers: Any) -> None:
    """Add the `scan` subcommand."""
    parser = subparsers.add_parser(
        "scan",
        help="one bounded discovery scan",
        description=__doc__,
        epilog=filter_epilog(),
        formatter_class=DefaultsHelp,
    )
    parser.error = types.MethodType(_one_line_error, parser)
    parser.add_argument("--transport", required=True, choices=TRANSPORTS, help="what to scan")
    parser.add_argument("--window", required=True, type=int, metavar="S", help="window in seconds")
    parser.add_argument(
        "--filter", action="append", default=[], metavar="KEY=VALUE", help="keep matching devices (below)"
    )
    parser.add_argument(
        "--exclude", action="append", default=[], metavar="KEY=VALUE", help="drop matching devices"
    )
    parser.add_argument(
        "--max-candidates", type=int, metavar="N", help="stop early after N devices (default: the catalog's)"
    )
    parser.add_argument(
        "--adapter", metavar="NAME", help="BLE adapter, e.g. hci0 (default: the first powered adapter)"
    )
    parser.add_argument(
        "--replay", type=Path, metavar="FILE", help="play an hw-fixtures file instead of real hardware"
    )
    parser.add_argument(
        "--replay-speed", type=float, default=1.0, metavar="X", help="replay at X times recorded speed"
    )
    parser.add_argument("--json", action="store_true", help="print only the final v2 status on stdout")
    parser.add_argument(
        "--catalog",
        type=Path,
        default=None,
        metavar="PATH",
        help="signed catalog (default: catalog/actions.json here, else the packaged example)",
    )
    parser.add_argument(
        "--trust", type=Path, default=None, metavar="DIR", help="operator keys (default: catalog/trust)"
    )
    parser.add_argument("--mdns-interfaces", type=_interfaces, metavar="IP[,IP...]|all")
    parser.set_defaults(handler=run)


def _one_line_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """argparse errors as one line on stderr, exit 2."""
    parser.exit(usage_error(f"scan: {message}"))


def _interfaces(text: str) -> tuple[str, ...] | str:
    """`IP[,IP...]` (IPv4 or IPv6 interface addresses) or `all`."""
    from providers.mdns_interfaces import parse_setting

    try:
        return parse_setting(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expects IP addresses separated by commas, or all") from None


def run(args: argparse.Namespace) -> int:
    """Resolve the scan (exit 2 on any input or catalog refusal), then run it through the one bridge."""
    # Imported here so that other subcommands never pay for (or depend on) the runtime and providers.
    from providers.replay import FixtureError

    problem = _flag_problem(args)
    if problem is not None:
        return usage_error(f"scan: {problem}")
    try:
        plan = _plan(args)
    except FixtureError as error:
        return usage_error(f"scan: --replay {args.replay}: {error.message}")
    except ProviderUnavailable as error:
        print(f"sensorium-connector: scan: {error.code}: {error.message}", file=sys.stderr)
        print(provider_hint(args.transport), file=sys.stderr)
        return EXIT_FAILED
    except AdmissionError as error:
        return usage_error(f"scan: {_explained(error, args)}")
    except CatalogError as error:
        return usage_error(f"scan: {_reason(error)}")
    bound_s = plan.scope.window_seconds + 2 * plan.spec.profile.cleanup_timeout_ms / 1000.0 + _BRIDGE_SLACK_S
    try:
        return anyio.run(_bridge, plan, bound_s)
    except TimeoutError:
        print("sensorium-connector: scan: the scan did not terminate in time", file=sys.stderr)
        return EXIT_FAILED


def _flag_problem(args: argparse.Namespace) -> str | None:
    """Flags that do not fit the transport, and a replay file that cannot be read (with the OS reason)."""
    if args.adapter is not None and not TRANSPORT_FACTS[args.transport].takes("adapter"):
        return "--adapter applies to --transport ble only (USB and mDNS have no adapter to choose)"
    if args.replay is not None:
        try:
            with open(args.replay, "rb"):
                pass
        except OSError as error:
            return f"--replay {args.replay}: {error.strerror or type(error).__name__}"
    return None


def _explained(error: AdmissionError, args: argparse.Namespace) -> str:
    """An input refusal naming the flag, the key and what is allowed."""
    profile = _profile_or_none(args)
    return explain_refusal(
        error, transport=args.transport, filters=args.filter, exclusions=args.exclude, profile=profile
    )


def _profile_or_none(args: argparse.Namespace) -> DiscoveryProfile | None:
    from connector.catalog.loader import load_verified_catalog
    from connector.cli.catalog_source import CHECKOUT_CATALOG, CHECKOUT_TRUST
    from connector.resources import example_catalog, example_trust

    # The same choice as `catalog_with_fallback`, without repeating its notice on stderr.
    if args.catalog is not None or CHECKOUT_CATALOG.is_file():
        path, trust = args.catalog or CHECKOUT_CATALOG, args.trust or CHECKOUT_TRUST
    else:
        path, trust = example_catalog(), args.trust or example_trust()
    try:
        catalog = load_verified_catalog(path, trust_dir=trust, data_dir=None, now=wall_clock())
        return catalog.discovery_profile(SCAN_ACTION)
    except SensoriumError:
        return None


def _reason(error: SensoriumError) -> str:
    """`code: message` plus the failing paths (never values) on one line."""
    details = "; ".join(d.get("message", d.get("code", "")) for d in error.diagnostics)
    return f"{error.code}: {error.message}" + (f" ({details})" if details else "")


def _plan(args: argparse.Namespace) -> ScanPlan:
    """The directive from the flags, admitted against the verified catalog; the provider to use."""
    from connector.catalog.loader import load_verified_catalog
    from connector.cli.catalog_source import catalog_with_fallback, test_key_note
    from connector.cli.scope_forms import scope_input_from_cli
    from providers.registry import build_provider

    raw = scope_input_from_cli(
        args.transport, args.window, args.filter, args.exclude, args.max_candidates, args.adapter
    )
    now = wall_clock()
    catalog_path, trust = catalog_with_fallback("scan", args.catalog, args.trust)
    catalog = load_verified_catalog(catalog_path, trust_dir=trust, data_dir=None, now=now)
    spec = _admitted(catalog, raw, now)
    if args.max_candidates is not None and spec.scope.max_candidates < args.max_candidates:
        print(
            f"scan: --max-candidates {args.max_candidates} is more than the catalog allows; "
            f"stopping after {spec.scope.max_candidates}",
            file=sys.stderr,
        )
    provider = build_provider(
        spec.scope.transport,
        replay=args.replay,
        replay_speed=args.replay_speed,
        ble_adapter=spec.scope.adapter,
        mdns_interfaces=args.mdns_interfaces,
    )
    notes = tuple(note for note in (test_key_note("scan", catalog),) if note is not None)
    return ScanPlan(spec=spec, provider=provider, json_output=args.json, notes=notes)


def _admitted(catalog: VerifiedCatalog, raw_input: dict[str, Any], now: datetime) -> SessionSpec:
    """The scan through the same admission as `serve` (CONTRACT §2), for the operator at the terminal."""
    from connector.core.admission import AdmittedScan, plan_admission
    from connector.core.policy import DeferredHostPolicy

    directive = {
        "schema": "sensorium-directive.v1",
        "action_id": SCAN_ACTION,
        "timing": {"mode": "async", "status_versions": [2]},
        "input": raw_input,
    }
    try:
        admitted = plan_admission(
            directive,
            principal=OPERATOR,
            catalog=catalog,
            policy=DeferredHostPolicy(),
            now=now,
            entropy=secrets.token_bytes,
            check_grant=False,
        )
    except AdmissionError as error:
        if error.code == Code.UNKNOWN_ACTION:
            raise _no_scan_action() from None
        raise
    if not isinstance(admitted, AdmittedScan):
        raise _no_scan_action()
    return admitted.session


def _no_scan_action() -> AdmissionError:
    return AdmissionError("no discovery action with this id in the catalog", code=Code.UNKNOWN_ACTION)


def _started_at(spec: SessionSpec, now_ms: int) -> SessionSpec:
    """The admitted times, moved to the moment the session starts (admission ran before the event loop)."""
    shift = now_ms - spec.created_at_ms

    def moved(ms: int | None) -> int | None:
        return None if ms is None else ms + shift

    return replace(
        spec,
        created_at_ms=now_ms,
        window_end_ms=spec.window_end_ms + shift,
        timeout_at_ms=moved(spec.timeout_at_ms),
        expires_at_ms=moved(spec.expires_at_ms),
    )


async def _bridge(plan: ScanPlan, bound_s: float) -> int:
    """The one sync-to-async bridge: run the scan under an overall bound."""
    with anyio.fail_after(bound_s):
        outcome = await _scan(plan)
    return _report(plan, outcome)


async def _scan(plan: ScanPlan) -> _Outcome:
    """One session through `DiscoveryManager`; Ctrl-C cancels it and waits for the confirmed stop."""
    from connector.core.clock import wall_clock_ms
    from connector.runtime.manager import DiscoveryManager

    outcome = _Outcome()
    console = Console(stderr=True)
    async with DiscoveryManager() as manager, anyio.create_task_group() as watchers:
        now_ms = wall_clock_ms()
        handle = await manager.start_scan(_started_at(plan.spec, now_ms), plan.provider)
        await watchers.start(_cancel_on_sigint, manager, handle.operation_id, outcome)
        console.print(
            f"scan: scanning {plan.scope.transport} for {plan.scope.window_seconds} s (Ctrl-C cancels)"
        )
        for note in plan.notes:
            console.print(note, markup=False, highlight=False, soft_wrap=True)
        outcome.status = await _follow(manager, handle.operation_id, plan.scope, now_ms, console, outcome)
        watchers.cancel_scope.cancel()
    return outcome


async def _cancel_on_sigint(
    manager: DiscoveryManager,
    operation_id: str,
    outcome: _Outcome,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Turn the first Ctrl-C into a cancel request; later ones only wait for the same confirmed stop."""
    with anyio.open_signal_receiver(signal.SIGINT) as signals:
        task_status.started()
        async for _ in signals:
            if not outcome.interrupted:
                outcome.interrupted = True
                manager.cancel(operation_id)


async def _follow(
    manager: DiscoveryManager,
    operation_id: str,
    scope: DiscoveryScope,
    started_ms: int,
    console: Console,
    outcome: _Outcome,
) -> dict[str, Any]:
    """Follow the session to its terminal status, redrawing the live view on every change.

    The live view is transient (it vanishes when the scan ends) and never taller than the terminal, so no
    stale frame is left in the scrollback; the final table is printed once, afterwards.
    """
    live = Live(console=console, refresh_per_second=8, transient=True) if console.is_terminal else None
    history = outcome.history = SignalHistory()
    revision = 0
    with live if live is not None else nullcontext():
        while True:
            status = await manager.wait_for_change(operation_id, revision, _REDRAW_S)
            revision = max(revision, revision_of(status))
            if "progress" in status:
                history.record(revision_of(status), candidates_of(status))
                outcome.last_candidates = candidates_of(status)
            if live is not None:
                live.update(render_live(status, scope, started_ms, history=history, height=console.height))
            if status["status"] not in ("pending", "running"):
                return status


def _report(plan: ScanPlan, outcome: _Outcome) -> int:
    """Print the terminal status (JSON alone, or one final table and a summary) and choose the exit code."""
    status = outcome.status or {}
    if plan.json_output:
        print(json.dumps(status, indent=2, ensure_ascii=False))
    else:
        _print_summary(status, plan.scope.transport, outcome)
    error = status.get("error") or {}
    if error.get("code") == Code.PROVIDER_UNAVAILABLE:
        print(provider_hint(plan.scope.transport), file=sys.stderr)
    state = status.get("status")
    if state == "completed":
        return EXIT_OK
    if state == "cancelled" and outcome.interrupted:
        return EXIT_CANCELLED
    return EXIT_FAILED


def _print_summary(status: Mapping[str, Any], transport: Transport, outcome: _Outcome) -> None:
    """Exactly one table with every candidate (after Ctrl-C: the last one seen), then one summary line."""
    console = Console()
    candidates = candidates_of(status)
    note = None
    if not candidates and outcome.interrupted and outcome.last_candidates:
        candidates, note = outcome.last_candidates, "the last table before Ctrl-C (the scan was cancelled)"
    if candidates:
        console.print(candidate_table(candidates, transport, history=outcome.history))
    if note is not None:
        console.print(note, highlight=False)
    line = f"{status.get('status')}"
    if "result" in status:
        result = status["result"]
        line += f" ({result['reason']}): {len(candidates)} candidate(s), revision {result['final_revision']}"
    elif "error" in status:
        line += f": {status['error']['code']} ({status['error']['message']})"
    console.print(line, highlight=False)
