"""`sensorium-connector`: the one command-line entry; subcommands register themselves here."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from connector.resources import version

# Each module exposes `register(subparsers)`; the parser it adds sets `handler(args) -> int`.
COMMAND_MODULES: tuple[str, ...] = (
    "connector.cli.schema_cmd",
    "connector.cli.catalog_cmd",
    "connector.cli.scan_cmd",
    "connector.cli.fixtures_cmd",
    "connector.cli.principals_cmd",
    "connector.cli.serve_cmd",
    "connector.cli.ops_cmd",
    "connector.cli.lab_cmd",
)

DESCRIPTION = """A Sensorium OS connector: bounded BLE, USB/serial and mDNS discovery scans as deferred
operations, with a reference host, an operator console and a NATS Bus face. Candidates stay in
memory; only a binding reveals a device's address."""
EPILOG = """common tasks:
  sensorium-connector serve                      run the service on 127.0.0.1:8787 (console under /admin/)
  sensorium-connector serve --simulate           the same with simulated devices, for CI (no hardware)
  sensorium-connector scan --transport ble --window 5 --filter service_uuid=180d
                                                 one scan from the terminal, with a live table
  sensorium-connector principals add --data-dir .sensorium --id NAME --role caller \
      --grant device.discovery.scan              a bearer token for a caller (printed once)

every command takes --help; exit codes: 0 done, 1 the operation failed, 2 a usage error, 130 cancelled."""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CANCELLED = 130


class DefaultsHelp(argparse.RawDescriptionHelpFormatter):
    """Help that shows each option's default, except where there is none or the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if "(default" in text or default in (None, [], False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every available subcommand."""
    parser = argparse.ArgumentParser(
        prog="sensorium-connector", description=DESCRIPTION, epilog=EPILOG, formatter_class=DefaultsHelp
    )
    parser.add_argument("--version", action="version", version=f"sensorium-connector {version()}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as missing:
            if missing.name != module_name:
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run the chosen subcommand, return its exit code."""
    args = build_parser().parse_args(argv)
    code: int = args.handler(args)
    return code


def usage_error(message: str) -> int:
    """Print a one-line usage reason on stderr and return exit code 2."""
    print(f"sensorium-connector: {message}", file=sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
