"""`python -m connector.diagrams {lifecycle,endings}` prints a core state machine as a Mermaid diagram.

The I/O edge of the pure tables in `connector.core.lifecycle` and `connector.core.endings`; the diagrams in
docs/ARCHITECTURE.md are this output (tests/core checks they are current).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from connector.core import endings, lifecycle

DIAGRAMS: dict[str, Callable[[], str]] = {"endings": endings.mermaid, "lifecycle": lifecycle.mermaid}


def main(argv: Sequence[str] | None = None) -> int:
    """Print the named diagram; an unknown or missing name is a usage error (exit 2)."""
    parser = argparse.ArgumentParser(prog="python -m connector.diagrams")
    parser.add_argument("diagram", choices=sorted(DIAGRAMS), help="which state machine to draw")
    args = parser.parse_args(argv)
    sys.stdout.write(DIAGRAMS[args.diagram]())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
