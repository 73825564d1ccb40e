"""Telemetry benchmark: the cost of one lifecycle event (log line + metrics) against a bare `logging.info`.

A session emits three to five lifecycle events in its life, so the figure that matters is the per-event
cost next to the cheapest logging call the process could make instead. Contenders, interleaved per round
(order rotated) so that machine noise hits all of them alike:

- `bare`: `logging.getLogger(...).info("%s", text)` with a pre-built text (the floor);
- `event-text`: `Telemetry.emit(session-like event)`: field checks, `key=value` text, the log record,
  the counter and the two histograms of an `ended` event;
- `event-json`: the same with the JSON Lines formatter on the handler.

Records go to a handler writing into an in-memory stream. Figures are medians of per-event wall times.

Usage: `.venv/bin/python bench/telemetry.py [--rounds 7] [--events 20000]`.
"""

from __future__ import annotations

import argparse
import io
import logging
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.pop(1)

from prometheus_client import CollectorRegistry

from connector.telemetry.events import LifecycleEvent, format_text
from connector.telemetry.logs import JsonLinesFormatter
from connector.telemetry.metrics import Telemetry

EVENT = LifecycleEvent(
    event="ended",
    operation_id="deferred:sensorium.directive.invoke:" + "A" * 26,
    action_id="device.discovery.scan",
    kind="discovery",
    status="completed",
    transport="ble",
    adapter="hci0",
    code="window-complete",
    cleanup="confirmed",
    claim="released",
    duration_ms=10_000,
    cleanup_ms=12,
)


def _handler(json_lines: bool) -> logging.Handler:
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(JsonLinesFormatter() if json_lines else logging.Formatter("%(name)s: %(message)s"))
    return handler


def _per_event_us(run: Callable[[], None], events: int) -> float:
    started = time.perf_counter()
    for _ in range(events):
        run()
    return (time.perf_counter() - started) / events * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--events", type=int, default=20000)
    args = parser.parse_args()
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    bare_logger = logging.getLogger("bench.bare")
    text = format_text(EVENT.fields())
    telemetry = Telemetry(CollectorRegistry())
    results: dict[str, list[float]] = {"bare": [], "event-text": [], "event-json": []}
    contenders: list[tuple[str, bool, Callable[[], None]]] = [
        ("bare", False, lambda: bare_logger.info("%s", text)),
        ("event-text", False, lambda: telemetry.emit(EVENT)),
        ("event-json", True, lambda: telemetry.emit(EVENT)),
    ]
    for round_no in range(args.rounds):
        order = contenders[round_no % 3 :] + contenders[: round_no % 3]
        for name, json_lines, run in order:
            handler = _handler(json_lines)
            root.addHandler(handler)
            try:
                results[name].append(_per_event_us(run, args.events))
            finally:
                root.removeHandler(handler)
    bare = statistics.median(results["bare"])
    print(f"python {platform.python_version()}, {args.rounds} rounds x {args.events} events")
    for name, values in results.items():
        median = statistics.median(values)
        print(f"{name:<11} {median:7.2f} us/event   {median / bare:5.2f}x bare logging.info")


if __name__ == "__main__":
    main()
