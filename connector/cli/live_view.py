"""The `scan` live view and final table: rendering only (rich renderables from status documents).

Rules of this file:
- the progress bar, the summary line and the table each take their own line;
- candidates are listed in a stable order: first seen, then label (then their details), never by ref;
- a live table never grows past the terminal: the rows that do not fit are counted in one `... N more`
  line under the table (a footer, not a row); the final table lists every candidate;
- at 80 columns and wider `#`, the whole label (up to 16 characters), RSSI with its sparkline and the time
  last seen keep their width; `details` gives way first and is cut with an ellipsis. Details name UUIDs and
  manufacturers from bleak's tables beside their numbers (`Heart Rate (180d)`); `--json` keeps numbers only;
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
from providers.ble_names import company_label, uuid_label

SPARK: Final = "▁▂▃▄▅▆▇█"
SPARK_READINGS: Final = 8
RSSI_FLOOR, RSSI_CEILING = -100, -30
BAR_WIDTH: Final = 40
# Lines the live view needs besides the table rows: bar, summary, table top, header, rule, bottom, "more".
_CHROME_LINES: Final = 7
# A device name is shown whole up to this many characters (longer ones end in an ellipsis).
LABEL_CHARS: Final = 16


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
    rows = ordered(candidates)
    shown = rows if max_rows is None or len(rows) <= max_rows else rows[: max(0, max_rows - 1)]
    table = Table(show_lines=False, expand=False, caption_justify="left")
    _add_columns(table, shown, signal)
    for index, candidate in enumerate(shown, start=1):
        cells: list[Any] = [str(index), Text(candidate.get("label", "-"), overflow="ellipsis", no_wrap=True)]
        if signal:
            rssi = candidate.get("signal", {}).get("rssi_dbm")
            spark = history.sparkline(candidate["candidate/ref"]) if history is not None else ""
            cells += ["-" if rssi is None else str(rssi), spark]
        cells.append(candidate["last_seen_at"][11:19])
        cells.append(Text(details(candidate), overflow="ellipsis", no_wrap=True))
        table.add_row(*cells)
    if len(shown) < len(rows):
        table.caption = Text(f"... {len(rows) - len(shown)} more", style="dim")
    return table


def _add_columns(table: Table, shown: Sequence[Mapping[str, Any]], signal: bool) -> None:
    """Every column but `details` keeps its width (`min_width`); `details` alone may shrink (wrappable for
    rich's collapse, while its cells stay one line cut with an ellipsis)."""
    labels = [len(str(c.get("label", "-"))) for c in shown]
    table.add_column("#", justify="right", no_wrap=True, min_width=len(str(max(1, len(shown)))))
    table.add_column(
        "label", no_wrap=True, min_width=min(LABEL_CHARS, max([5, *labels])), max_width=2 * LABEL_CHARS
    )
    if signal:
        table.add_column("rssi", justify="right", no_wrap=True, min_width=4)
        table.add_column("recent", no_wrap=True, min_width=SPARK_READINGS)
    table.add_column("last seen", no_wrap=True, min_width=9)
    table.add_column("details", no_wrap=False, overflow="ellipsis")


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
    parts = [uuid_label(uuid) for uuid in ble.get("service_uuids", [])]
    parts += [company_label(company) for company in ble.get("manufacturer_ids", [])]
    return ", ".join(parts)


# Read from the candidate member of the transport (`CONTENT_KEYS`); a candidate with none reads as BLE.
_DETAILS: Mapping[Transport, Callable[[Mapping[str, Any]], str]] = {
    "usb-serial": _usb_details,
    "mdns": _mdns_details,
    "ble": _ble_details,
}
