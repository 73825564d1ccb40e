"""The `scan` live view in a real terminal emulator: tmux (100x30), read back with `capture-pane`.

While scanning: the bar, the summary and the table start on lines of their own, and a table taller than the
terminal shows `... N more`. Afterwards exactly one table remains in the scrollback and it lists every
candidate. Ctrl-C keeps the last table and exits 130.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.support.paths import REPO

TMUX = shutil.which("tmux")
OFFICE = "hw-fixtures/ble-office-crowd.jsonl"
BENCH = "hw-fixtures/ble-mixed-bench.jsonl"
pytestmark = [
    pytest.mark.skipif(TMUX is None, reason="needs tmux (scripts/bootstrap.sh installs it)"),
    pytest.mark.terminal,
]


class Pane:
    """One detached tmux session on a private server socket (never the user's tmux)."""

    def __init__(self, command: str, width: int = 100, height: int = 30) -> None:
        self.socket = f"sensorium15-{os.getpid()}-{secrets.token_hex(3)}"
        self._tmux("new-session", "-d", "-s", "scan", "-x", str(width), "-y", str(height), command)

    def _tmux(self, *args: str) -> str:
        assert TMUX is not None
        done = subprocess.run([TMUX, "-L", self.socket, *args], capture_output=True, text=True, timeout=10)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def screen(self) -> str:
        """The visible screen."""
        return self._tmux("capture-pane", "-p", "-t", "scan")

    def everything(self) -> str:
        """Scrollback and screen."""
        return self._tmux("capture-pane", "-p", "-S", "-", "-t", "scan")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "scan", *keys)

    def wait_for(self, pattern: str, timeout: float, *, whole: bool = False) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.everything() if whole else self.screen()
            if re.search(pattern, text, re.M):
                return text
            time.sleep(0.1)  # real peer: the scan process draws in the tmux pane
        raise AssertionError(f"{pattern!r} did not show up:\n{self.everything()}")

    def close(self) -> None:
        assert TMUX is not None
        subprocess.run([TMUX, "-L", self.socket, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def pane_factory() -> Iterator[list[Pane]]:
    panes: list[Pane] = []
    yield panes
    for pane in panes:
        pane.close()


def _scan_command(
    window: int, speed: float, filters: str = "manufacturer_id=0x0006", replay: str = OFFICE
) -> str:
    scan = (
        f"{REPO}/.venv/bin/python -m connector scan --transport ble --window {window} "
        f"--filter {filters} --replay {replay} --replay-speed {speed}"
    )
    return f"cd {REPO} && {scan}; echo EXIT=$?; sleep 60"


def _table_tops(text: str) -> int:
    return len(re.findall(r"^[┏┌]━*", text, re.M))


@pytest.mark.timeout(90)
def test_live_view_fits_the_terminal_then_one_full_table_remains(pane_factory: list[Pane]) -> None:
    pane = Pane(_scan_command(window=8, speed=2.0))
    pane_factory.append(pane)
    live = pane.wait_for(r"^\s*│?\s*\.\.\. \d+ more", timeout=30)
    lines = live.splitlines()
    bar = next(i for i, line in enumerate(lines) if re.search(r"[━─]{10,} \d+\.\d/8 s$", line))
    assert re.match(r"^running\s+\d+ candidate\(s\)\s+revision \d+", lines[bar + 1]), lines[bar : bar + 3]
    assert re.match(r"^[┏┌]", lines[bar + 2]), "the table starts on its own line"
    assert len(lines) <= 30 and all(len(line) <= 100 for line in lines)
    assert re.search(r"[▁▂▃▄▅▆▇█]", live), "an RSSI sparkline per candidate"
    done = pane.wait_for(r"^EXIT=0$", timeout=40, whole=True)
    assert _table_tops(done) == 1, done  # the live frames left nothing behind
    count = int(re.search(r"completed \(window-complete\): (\d+) candidate\(s\)", done).group(1))  # type: ignore[union-attr]
    assert count > 23  # more than the live view could show
    numbers = [int(n) for n in re.findall(r"^│\s*(\d+) │", done, re.M)]
    assert numbers == list(range(1, count + 1)), "every candidate, once, in order"
    assert "more" not in done.split("EXIT=0")[0].rsplit("┏", 1)[-1]
    assert re.search(r"([0-9A-F]{2}:){5}[0-9A-F]{2}", done) is None, "never an address"


@pytest.mark.timeout(90)
def test_ctrl_c_keeps_the_last_table(pane_factory: list[Pane]) -> None:
    pane = Pane(_scan_command(window=30, speed=1.0))
    pane_factory.append(pane)
    pane.wait_for(r"^\s*│\s+5 │", timeout=30)
    pane.keys("C-c")
    done = pane.wait_for(r"^EXIT=130$", timeout=20, whole=True)
    assert "the last table before Ctrl-C" in done
    assert _table_tops(done) == 1
    assert re.search(r"^cancelled\b", done, re.M)


def test_the_order_is_stable_between_runs() -> None:
    from connector.cli.live_view import ordered

    candidates = [
        {"candidate/ref": "r2", "first_seen_at": "2026-12-01T10:00:01Z", "label": "B"},
        {"candidate/ref": "r1", "first_seen_at": "2026-12-01T10:00:01Z", "label": "A"},
        {"candidate/ref": "r0", "first_seen_at": "2026-12-01T10:00:00Z", "label": "Z"},
    ]
    assert [c["label"] for c in ordered(candidates)] == ["Z", "A", "B"]
    assert [c["label"] for c in ordered(list(reversed(candidates)))] == ["Z", "A", "B"]


def _cells(line: str) -> list[str]:
    """The cells of one box-drawn table row (or of the header, drawn with heavy lines)."""
    bar = "┃" if "┃" in line else "│"
    return [cell.strip() for cell in line.strip().strip(bar).split(bar)]


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("width", "height", "replay", "footer"),
    [(80, 24, BENCH, False), (80, 24, OFFICE, True), (100, 30, OFFICE, True), (160, 40, OFFICE, True)],
)
def test_the_columns_stay_readable_at_every_width(
    pane_factory: list[Pane], width: int, height: int, replay: str, footer: bool
) -> None:
    pane = Pane(_scan_command(8, 2.0, filters="name_prefix=SYNTH", replay=replay), width, height)
    pane_factory.append(pane)
    live = pane.wait_for(r"^\.\.\. \d+ more" if footer else r"│\s+4 │", timeout=30)
    lines = live.splitlines()
    assert len(lines) <= height and all(len(line) <= width for line in lines)
    header = next(line for line in lines if "label" in line and "details" in line)
    assert _cells(header) == ["#", "label", "rssi", "recent", "last seen", "details"]
    rows = [_cells(line) for line in lines if re.match(r"^│\s*\d+ │", line)]
    assert rows, live
    for number, label, rssi, recent, seen, _ in rows:
        assert number.isdigit() and re.fullmatch(r"-\d{1,3}", rssi), (number, rssi)
        assert label.startswith("SYNTH") and ("…" not in label or len(label) >= 16), label  # whole to 16
        assert re.fullmatch(r"\d\d:\d\d:\d\d", seen), seen
        assert re.fullmatch(r"[▁▂▃▄▅▆▇█]*", recent), recent
    more = [line for line in lines if re.search(r"\d+ more", line)]
    assert all(line.startswith("... ") for line in more), "the N more line is a footer, not a row"
    if width >= 160:
        assert re.search(r"[A-Z][\w .,&-]+ \((0x[0-9a-f]{4}|[0-9a-f]{4}|[0-9a-f]{8})\)", live), "names"
    if replay == BENCH:
        assert "Nordic UART Service (6e4" in live
    assert re.search(r"([0-9A-F]{2}:){5}[0-9A-F]{2}", live) is None, "never an address"
