"""Synthesised `sensorium-hw-fixture.v1` replay files."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def write_fixture(path: Path, transport: str, lines: Sequence[Mapping[str, Any]]) -> Path:
    """A synthesised JSON Lines fixture: the header (adapter `hci0` for BLE), then one line per event."""
    header: dict[str, Any] = {
        "fixture": "sensorium-hw-fixture.v1",
        "transport": transport,
        "source": "synthesised",
        "recorded_at": "2026-11-30T09:00:00Z",
        "versions": {"generator": "tests", "format": 1},
        "notes": "Synthesised by a test.",
    }
    if transport == "ble":
        header["adapter"] = "hci0"
    text = "\n".join(json.dumps(line, separators=(",", ":")) for line in (header, *lines))
    path.write_text(text + "\n", encoding="utf-8")
    return path
