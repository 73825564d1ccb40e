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
    parser = argparse.ArgumentParser(prog="sensorium-connector", description=__doc__)
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
