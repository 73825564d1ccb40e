"""The `scan` live view and final table: rendering only (rich renderables from status documents).

Rules of this file:
- the progress bar, the summary line and the table each take their own line;
- candidates are listed in a stable order: first seen, then label (then their details), never by ref;
- a live table never grows past the terminal: the rows that do not fit are counted in one `... N more`
  row; the final table lists every candidate;
- the RSSI sparkline is the last readings of each candidate, kept in this process's memory only (and only
  for transports that report a signal);
- nothing here ever shows an address: candidates carry none.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from rich.console import Group
from rich.table import Table
from rich.text import Text

from connector.contract.transports import CONTENT_KEYS, Transport
from connector.core.scope import DiscoveryScope
from connector.core.transports import TRANSPORT_FACTS

SPARK: Final = "▁▂▃▄▅▆▇█"
SPARK_READINGS: Final = 8
RSSI_FLOOR, RSSI_CEILING = -100, -30
BAR_WIDTH: Final = 40
# Lines the live view needs besides the table rows: bar, summary, table top, header, rule, bottom, "more".
_CHROME_LINES: Final = 7
_BLE_BASE_SUFFIX: Final = "-0000-1000-8000-00805f9b34fb"


@dataclass(slots=True)
class SignalHistory:
    """The last RSSI readings per candidate ref (memory only, gone with the process)."""

    readings: dict[str, deque[int]] = field(default_factory=dict)
    seen_revision: int = 0

    def record(self, revision: int, candidates: Sequence[Mapping[str, Any]]) -> None:
        """Add one reading per candidate for a revision not recorded yet."""
        if revision <= self.seen_revision:
            return
        self.seen_revision = revision
        for candidate in candidates:
            rssi = candidate.get("signal", {}).get("rssi_dbm")
            if isinstance(rssi, int):
                ring = self.readings.setdefault(candidate["candidate/ref"], deque(maxlen=SPARK_READINGS))
                ring.append(rssi)

    def sparkline(self, ref: str) -> str:
        """The readings as block characters, oldest first."""
        return "".join(_spark(rssi) for rssi in self.readings.get(ref, ()))


def _spark(rssi: int) -> str:
    span = RSSI_CEILING - RSSI_FLOOR
    level = (min(max(rssi, RSSI_FLOOR), RSSI_CEILING) - RSSI_FLOOR) * (len(SPARK) - 1) // span
    return SPARK[level]


def candidates_of(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The candidates a status carries (result first, else the progress snapshot)."""
    if "result" in status:
        return list(status["result"].get("candidates", []))
    progress = status.get("progress")
    return list(progress["snapshot"]["candidates"]) if progress else []


def revision_of(status: Mapping[str, Any]) -> int:
    """The progress revision of a status (0 without progress)."""
    progress = status.get("progress")
    return int(progress["revision"]) if progress else 0


def ordered(candidates: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """First seen, then label, then details: the same order on every run of the same devices."""
    return sorted(
        candidates, key=lambda c: (c.get("first_seen_at", ""), c.get("label", "\uffff"), details(c))
    )


def progress_line(elapsed_ms: int, window_ms: int) -> Text:
    """A bar over the window, with the seconds, on a line of its own."""
    share = 0.0 if window_ms <= 0 else min(1.0, elapsed_ms / window_ms)
    filled = round(share * BAR_WIDTH)
    bar = Text("━" * filled, style="bold cyan")
    bar.append("─" * (BAR_WIDTH - filled), style="dim")
    bar.append(f" {elapsed_ms / 1000:.1f}/{window_ms // 1000} s")
    return bar


def render_live(
    status: Mapping[str, Any],
    scope: DiscoveryScope,
    started_ms: int,
    *,
    history: SignalHistory | None = None,
    height: int | None = None,
) -> Group:
    """The live view: the bar, a summary line, and the candidate table cut to fit `height` lines."""
    window_ms = scope.window_seconds * 1000
    elapsed = min(window_ms, max(0, time.time_ns() // 1_000_000 - started_ms))
    candidates = candidates_of(status)
    summary = Text(
        f"{status['status']}  {len(candidates)} candidate(s)  revision {revision_of(status)}  "
        "(Ctrl-C cancels)"
    )
    room = None if height is None else max(1, height - _CHROME_LINES)
    table = candidate_table(candidates, scope.transport, history=history, max_rows=room)
    return Group(progress_line(elapsed, window_ms), summary, table)


def candidate_table(
    candidates: Sequence[Mapping[str, Any]],
    transport: Transport,
    *,
    history: SignalHistory | None = None,
    max_rows: int | None = None,
) -> Table:
    """A table of candidates; the rssi columns only for BLE (the only transport reporting a signal)."""
    signal = TRANSPORT_FACTS[transport].signal
    table = Table(show_lines=False, expand=False)
    columns = ["#", "label", "details"] + (["rssi", "recent"] if signal else []) + ["last seen"]
    for column in columns:
        table.add_column(column, justify="right" if column in ("#", "rssi") else "left", no_wrap=True)
    rows = ordered(candidates)
    shown = rows if max_rows is None or len(rows) <= max_rows else rows[: max(0, max_rows - 1)]
    for index, candidate in enumerate(shown, start=1):
        cells: list[Any] = [str(index), Text(candidate.get("label", "-")), Text(details(candidate))]
        if signal:
            rssi = candidate.get("signal", {}).get("rssi_dbm")
            spark = history.sparkline(candidate["candidate/ref"]) if history is not None else ""
            cells += ["-" if rssi is None else str(rssi), spark]
        cells.append(candidate["last_seen_at"][11:19])
        table.add_row(*cells)
    if len(shown) < len(rows):
        more = [f"... {len(rows) - len(shown)} more"] + [""] * (len(columns) - 1)
        table.add_row(*more, style="dim")
    return table


def details(candidate: Mapping[str, Any]) -> str:
    """A short transport-specific description (never an address: candidates carry none)."""
    for transport, describe in _DETAILS.items():
        if CONTENT_KEYS[transport] in candidate:
            return describe(candidate[CONTENT_KEYS[transport]])
    return _ble_details({})


def _usb_details(usb: Mapping[str, Any]) -> str:
    ids = f"{usb['vid']:04x}:{usb['pid']:04x}" if "vid" in usb and "pid" in usb else "no usb ids"
    fields = (ids, usb.get("manufacturer", ""), usb.get("product", ""), usb.get("interface", ""))
    return " ".join(str(part) for part in fields if part)


def _mdns_details(mdns: Mapping[str, Any]) -> str:
    return str(mdns.get("service_type", ""))


def _ble_details(ble: Mapping[str, Any]) -> str:
    parts = [uuid[4:8] if uuid.endswith(_BLE_BASE_SUFFIX) else uuid for uuid in ble.get("service_uuids", [])]
    parts += [f"mfr 0x{company:04x}" for company in ble.get("manufacturer_ids", [])]
    return ", ".join(parts)


# Read from the candidate member of the transport (`CONTENT_KEYS`); a candidate with none reads as BLE.
_DETAILS: Mapping[Transport, Callable[[Mapping[str, Any]], str]] = {
    "usb-serial": _usb_details,
    "mdns": _mdns_details,
    "ble": _ble_details,
}
