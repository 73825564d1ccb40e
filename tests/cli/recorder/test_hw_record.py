"""Opt-in (`--hw` or SENSORIUM_HW=1): record 5 s from the real default BLE adapter through the CLI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from providers.replay import load_fixture
from tests.cli.recorder.support import fixture_lines, spawn_cli

PSEUDONYM = re.compile(r"[0-9A-F][26AE](:[0-9A-F]{2}){5}")


@pytest.mark.hw
def test_five_seconds_from_the_default_adapter(tmp_path: Path) -> None:
    target = tmp_path / "hw-ble.jsonl"
    child = spawn_cli(["fixtures", "record", "--transport", "ble", "--seconds", "5", "-o", str(target),
                       "--notes", "opt-in hardware test"])
    try:
        _, stderr = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, stderr
    assert target.stat().st_mode & 0o777 == 0o600
    header, *lines = fixture_lines(target)
    assert header["fixture"] == "sensorium-hw-fixture.v1"
    assert (header["transport"], header["source"], header["adapter"]) == ("ble", "recorded", None)
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z", header["recorded_at"])
    assert set(header["versions"]) == {"bleak", "zeroconf", "pyserial", "python", "sensorium-os-connector"}
    assert header["notes"].startswith("opt-in hardware test")
    # Whatever was around: valid lines, within the window, pseudonymised addresses only.
    fixture = load_fixture(target)
    assert fixture.transport == "ble" and fixture.source == "recorded"
    assert all(0 <= line["t_ms"] <= 6000 for line in lines)
    assert all(PSEUDONYM.fullmatch(line["address"]) for line in lines)
