"""`sensorium-connector fixtures record`: record one session from a real adapter into an hw-fixtures file.

The provider runs unfiltered for `--seconds`, and every observation becomes a line of the hw-fixtures format,
with identities pseudonymised unless `--keep-identities`. mDNS has no "every service" browse: the recorder
records the `--service-type` values given, or else first browses `_services._dns-sd._udp.local.` for
`--types-seconds` to learn the types announced on the network and then records those.

Exit codes: 0 recorded; 1 the provider failed (no adapter, backend failure, a stop it did not
acknowledge) or the file could not be written, with the error code on stderr; 2 usage error; 130 Ctrl-C
aborted the recording and the provider's stop was confirmed (nothing is kept).
"""

from __future__ import annotations

import argparse
import functools
import signal
import sys
import types
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import anyio
from anyio.abc import TaskStatus

from connector.cli.main import EXIT_CANCELLED, EXIT_FAILED, EXIT_OK, usage_error
from connector.cli.recorder import (
    MAX_RECORDING_SECONDS,
    FixtureFile,
    FixtureHeader,
    Pseudonymiser,
    Recorder,
    RecordingOutcome,
    RecordingResult,
    library_versions,
    recording_scope,
    rfc3339_seconds,
)
from connector.cli.scan_help import provider_hint
from connector.contract.transports import TRANSPORTS, Transport
from connector.core.scope import DiscoveryProfile, normalise_service_type, parse_discovery_input
from connector.core.transports import TRANSPORT_FACTS
from connector.errors import AdmissionError, Code, ProviderError, ProviderUnavailable
from providers.base import Provider
from providers.registry import build_provider

SERVICE_TYPE_ENUMERATION = "_services._dns-sd._udp.local."
DEFAULT_TYPES_SECONDS = 3
MAX_TYPES_SECONDS = 60
# Validates `--service-type` and `--adapter` with the very rules of a scan input.
_INPUT_RULES = DiscoveryProfile(
    transports=TRANSPORTS,
    max_window_seconds=MAX_RECORDING_SECONDS,
    max_candidates=64,
    max_snapshot_bytes=65536,
    min_revision_interval_ms=250,
    max_revisions=1000,
    candidate_ttl_seconds=30,
    cleanup_timeout_ms=2000,
    allow_unfiltered=True,
)
# Slack on top of the recording, the type browse and the stop bound before the bridge gives up.
_BRIDGE_SLACK_S = 10.0


class _Usage(ValueError):
    """A usage error; its text names flags and rules only."""


def register(subparsers: Any) -> None:
    """Add `fixtures record`."""
    fixtures = subparsers.add_parser("fixtures", help="hardware fixtures for the replay backend")
    commands = fixtures.add_subparsers(dest="fixtures_command", required=True)
    record = commands.add_parser("record", help="record a session from a real adapter", description=__doc__)
    record.error = types.MethodType(_one_line_error, record)
    record.add_argument("--transport", required=True, choices=TRANSPORTS)
    record.add_argument("--seconds", required=True, type=_seconds, metavar="S", help="recording length")
    record.add_argument("-o", "--output", required=True, type=Path, metavar="FILE")
    record.add_argument("--keep-identities", action="store_true", help="do not pseudonymise (never share)")
    record.add_argument("--mdns-interfaces", type=_interfaces, metavar="IP[,IP...]|all")
    record.add_argument("--adapter", metavar="NAME", help="BLE adapter, e.g. hci0 (BLE only)")
    record.add_argument("--service-type", action="append", default=[], metavar="TYPE", help="repeatable")
    record.add_argument("--types-seconds", type=_types_seconds, default=DEFAULT_TYPES_SECONDS, metavar="S")
    record.add_argument("--notes", default="", metavar="TEXT", help="what was recorded, for the header")
    record.set_defaults(handler=run)


def _one_line_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """argparse errors as one line on stderr, exit 2, cut before the first quoted value it would echo."""
    reason = message.split("'", 1)[0].rstrip(" :(")
    if reason.startswith("unrecognized arguments"):
        reason = "unrecognized arguments"
    parser.exit(usage_error(f"fixtures record: {reason}"))


def _bounded_int(text: str, high: int) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError("expects a whole number of seconds") from None
    if not 1 <= value <= high:
        raise argparse.ArgumentTypeError(f"expects 1 to {high} seconds")
    return value


def _seconds(text: str) -> int:
    return _bounded_int(text, MAX_RECORDING_SECONDS)


def _types_seconds(text: str) -> int:
    return _bounded_int(text, MAX_TYPES_SECONDS)


def _interfaces(text: str) -> tuple[str, ...] | str:
    """`IP[,IP...]` (IPv4 or IPv6 interface addresses) or `all`."""
    from providers.mdns_interfaces import parse_setting

    try:
        return parse_setting(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expects IP addresses separated by commas, or all") from None


# ---------------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """Check the flags (exit 2), then record through the one sync-to-async bridge."""
    try:
        _check_flags(args)
        service_types = _given_service_types(args.service_type)
        adapter = _given_adapter(args.adapter)
        output = _output_target(args.output)
    except _Usage as reason:
        return usage_error(f"fixtures record: {reason}")
    try:
        provider = build_provider(
            args.transport, ble_adapter=adapter, mdns_interfaces=args.mdns_interfaces, every_report=True
        )
    except ProviderUnavailable as error:
        return _provider_failed(error, args.transport)
    bound_s = args.seconds + args.types_seconds + _BRIDGE_SLACK_S
    code: int = anyio.run(_bridge, args, provider, output, service_types, adapter, bound_s)
    return code


def _check_flags(args: argparse.Namespace) -> None:
    """Transport-specific flags belong to their transport."""
    facts = TRANSPORT_FACTS[args.transport]
    if args.service_type and "service_types" not in facts.filter_keys:
        raise _Usage("--service-type applies to --transport mdns only")
    if args.mdns_interfaces is not None and not facts.takes("interfaces"):
        raise _Usage("--mdns-interfaces applies to --transport mdns only")
    if args.adapter is not None and not facts.takes("adapter"):
        raise _Usage("--adapter applies to --transport ble only (USB and mDNS have no adapter to choose)")


def _input_rule(raw: dict[str, Any], flag: str) -> Any:
    """Parse a small scan input with the core's rules; refusals name the flag and rule, never the value."""
    try:
        return parse_discovery_input(raw, _INPUT_RULES)
    except AdmissionError as error:
        rules = sorted({d.get("message", "").rpartition(": ")[2] for d in error.diagnostics} - {""})
        raise _Usage(f"{flag}: {', '.join(rules) or error.code}") from None


def _given_service_types(values: Sequence[str]) -> tuple[str, ...]:
    """`--service-type` values, normalised (`_http._tcp` -> `_http._tcp.local.`)."""
    if not values:
        return ()
    raw = {"transport": "mdns", "window_seconds": 1, "filters": {"service_types": list(values)}}
    scope = _input_rule(raw, "--service-type")
    return tuple(scope.filters.service_types)


def _given_adapter(name: str | None) -> str | None:
    """`--adapter` checked against the adapter-name rule."""
    if name is None:
        return None
    scope = _input_rule({"transport": "ble", "window_seconds": 1, "adapter": name}, "--adapter")
    return str(scope.adapter)


def _output_target(path: Path) -> FixtureFile:
    """The output file: its folder must exist, and it must not be a folder itself."""
    if path.name in ("", ".", "..") or path.is_dir():
        raise _Usage("-o must name a file, not a folder")
    if not path.parent.is_dir():
        raise _Usage("-o: the folder of the output file does not exist")
    return FixtureFile(path)


def _provider_failed(error: ProviderError, transport: str | None = None) -> int:
    print(f"sensorium-connector: fixtures record: {error.code}: {error.message}", file=sys.stderr)
    if error.code == Code.PROVIDER_UNAVAILABLE and transport is not None:
        print(provider_hint(transport), file=sys.stderr)
    return EXIT_FAILED


# ---------------------------------------------------------------------------------------------------------


class _CtrlC:
    """What the first Ctrl-C ends: the type browse (nothing started yet) or the recording (it aborts)."""

    def __init__(self) -> None:
        self.pressed = False
        self.recorder: Recorder | None = None
        self.browse = anyio.CancelScope()

    def press(self) -> None:
        """Ctrl-C: end whatever runs; the provider's stop is still awaited."""
        self.pressed = True
        self.browse.cancel()
        if self.recorder is not None:
            self.recorder.abort()


async def _on_sigint(ctrl_c: _CtrlC, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    with anyio.open_signal_receiver(signal.SIGINT) as signals:
        task_status.started()
        async for _ in signals:
            ctrl_c.press()


async def _bridge(
    args: argparse.Namespace,
    provider: Provider,
    output: FixtureFile,
    service_types: tuple[str, ...],
    adapter: str | None,
    bound_s: float,
) -> int:
    """The one sync-to-async bridge: Ctrl-C handling, a bound on the whole run, closing the provider."""
    ctrl_c = _CtrlC()
    code = EXIT_FAILED
    work = functools.partial(_learn_and_record, args, provider, output, service_types, adapter, ctrl_c)
    try:
        async with anyio.create_task_group() as watchers:
            await watchers.start(_on_sigint, ctrl_c)
            with anyio.move_on_after(bound_s) as bound:
                code = await _translated(work, args.transport)
            watchers.cancel_scope.cancel()
    finally:
        await _close(provider)
    return _failed("the recording did not end in time") if bound.cancelled_caught else code


async def _translated(work: Callable[[], Awaitable[int]], transport: str) -> int:
    """Failures as exit code 1 with a one-line reason (the code for provider errors; never a value)."""
    try:
        return await work()
    except ProviderError as error:
        return _provider_failed(error, transport)
    except OSError:
        return _failed("cannot write the output file")


def _failed(reason: str) -> int:
    print(f"sensorium-connector: fixtures record: {reason}", file=sys.stderr)
    return EXIT_FAILED


async def _learn_and_record(
    args: argparse.Namespace,
    provider: Provider,
    output: FixtureFile,
    service_types: tuple[str, ...],
    adapter: str | None,
    ctrl_c: _CtrlC,
) -> int:
    """Learn the mDNS types when none were given, then record."""
    transport: Transport = args.transport
    if "service_types" in TRANSPORT_FACTS[transport].required_filters and not service_types:
        with ctrl_c.browse:
            service_types = await _learn_service_types(args.mdns_interfaces, args.types_seconds)
        if ctrl_c.pressed:
            print("sensorium-connector: fixtures record: aborted; nothing was written", file=sys.stderr)
            return EXIT_CANCELLED
        if not service_types:
            return _failed("no mdns service types were announced; pass --service-type")
    scope = recording_scope(transport, args.seconds, adapter=adapter, service_types=service_types)
    names = None if args.keep_identities else Pseudonymiser()
    recorder = Recorder(provider, scope, output, _header(transport, adapter, args), pseudonymiser=names)
    ctrl_c.recorder = recorder
    if ctrl_c.pressed:
        recorder.abort()
    result = await recorder.run(args.seconds, task_status=_Announce(args.seconds))
    return _report(result, args.keep_identities, transport)


class _Announce:
    """The recorder's task status: tells the operator once the provider runs."""

    def __init__(self, seconds: int) -> None:
        self._seconds = seconds

    def started(self, value: None = None) -> None:
        """The provider session runs."""
        message = f"fixtures record: recording for {self._seconds} s (Ctrl-C aborts, keeps nothing)"
        print(message, file=sys.stderr)


async def _close(provider: Provider) -> None:
    """Close a provider that holds process-wide resources (the shared mDNS engine)."""
    aclose = getattr(provider, "aclose", None)
    if aclose is not None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(5.0):
            await aclose()


def _header(transport: Transport, adapter: str | None, args: argparse.Namespace) -> FixtureHeader:
    """The header of this recording; interfaces are host addresses, so `adapter` names BLE adapters only."""
    identities = "identities kept (do not share)" if args.keep_identities else "identities pseudonymised"
    notes = args.notes.strip() or "Recorded with `sensorium-connector fixtures record`; describe the setup."
    return FixtureHeader(
        transport=transport,
        recorded_at=rfc3339_seconds(datetime.now(UTC)),
        adapter=adapter,
        versions=library_versions(),
        notes=f"{notes} [{args.seconds} s, {identities}]",
    )


def _report(result: RecordingResult, kept_identities: bool, transport: str) -> int:
    """One line on stderr about the outcome, and the exit code."""
    prefix = "sensorium-connector: fixtures record"
    if result.outcome is RecordingOutcome.FAILED:
        assert result.error is not None
        return _provider_failed(result.error, transport)
    if result.outcome is RecordingOutcome.ABORTED:
        if not result.stop_confirmed:
            print(f"{prefix}: aborted, but the provider's stop was not confirmed", file=sys.stderr)
            return EXIT_FAILED
        print(f"{prefix}: aborted; nothing was written", file=sys.stderr)
        return EXIT_CANCELLED
    kind = "real identities" if kept_identities else "pseudonymised identities"
    print(
        f"fixtures record: wrote {result.observations} observation line(s) with {kind}; "
        "review the file for personal data before sharing it",
        file=sys.stderr,
    )
    if not result.stop_confirmed:
        code = result.error.code if result.error is not None else Code.CLEANUP_UNCONFIRMED
        print(f"{prefix}: {code}: the provider did not confirm its stop", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


# ---------------------------------------------------------------------------------------------------------
# mDNS service type enumeration (RFC 6763 section 9)


def _is_service_type(name: str) -> bool:
    labels = name.lower().rstrip(".").split(".")
    if len(labels) != 3:
        return False
    return labels[0].startswith("_") and labels[1] in ("_tcp", "_udp") and labels[2] == "local"


async def _learn_service_types(interfaces: Sequence[str] | str | None, seconds: float) -> tuple[str, ...]:
    """Browse the DNS-SD meta-query for `seconds`; the service types announced on the chosen interfaces."""
    print(f"fixtures record: learning the mdns service types for {seconds} s", file=sys.stderr)
    return await find_service_types(interfaces, seconds)


async def find_service_types(interfaces: Sequence[str] | str | None, seconds: float) -> tuple[str, ...]:
    """Service types answered to `_services._dns-sd._udp.local.` within `seconds` (QM questions)."""
    from zeroconf import DNSQuestionType, ServiceStateChange, Zeroconf
    from zeroconf.asyncio import AsyncServiceBrowser

    from providers.mdns import open_engine
    from providers.mdns_interfaces import NoMulticastInterface, check_setting, select_interfaces

    found: set[str] = set()

    def on_change(zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        if state_change is not ServiceStateChange.Removed and _is_service_type(name):
            found.add(normalise_service_type(name))

    try:  # the same interfaces a recording session would use (CONTRACT §12)
        selection = select_interfaces(check_setting(interfaces))
    except NoMulticastInterface as reason:
        raise ProviderUnavailable(str(reason)) from None
    azc = await open_engine(selection)
    try:
        browser = AsyncServiceBrowser(
            azc.zeroconf, [SERVICE_TYPE_ENUMERATION], handlers=[on_change], question_type=DNSQuestionType.QM
        )
        try:
            await anyio.sleep(seconds)
        finally:
            with anyio.CancelScope(shield=True):
                await browser.async_cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await azc.async_close()
    return tuple(sorted(found))
