"""`sensorium-connector scan` end to end, as a subprocess, on replayed fixtures and the shipped catalog."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from rich.console import Console

from connector.cli.live_view import render_live
from connector.cli.main import main
from connector.core.scope import DiscoveryScope, ScopeFilter
from providers.replay import ReplayProvider
from tests.runtime.sessions import assert_valid_polls, fast_manager, poll_to_end, start
from tests.runtime.support import ble_scope
from tests.support.paths import REPO

HRM_LAB = "hw-fixtures/ble-heart-rate-lab.jsonl"
OFFICE = "hw-fixtures/ble-office-crowd.jsonl"
USB_IDS = ((0x0403, 0x6001), (0x2341, 0x0043), (0x10C4, 0xEA60))
CAST = ("_googlecast._tcp.local.", "_http._tcp.local.")


def scan(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "connector", "scan", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
    )


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("FORCE_COLOR", None)
    return env


@pytest.mark.realtime  # a `python -m connector scan` process
def test_a_replayed_scan_prints_only_the_final_v2_status() -> None:
    done = scan(
        "--transport",
        "ble",
        "--window",
        "2",
        "--filter",
        "service_uuid=180d",
        "--replay",
        HRM_LAB,
        "--replay-speed",
        "20",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["schema"] == "deferred-operation-status.v2" and status["status"] == "completed"
    assert status["result"]["reason"] == "window-complete"
    labels = sorted(c["label"] for c in status["result"]["candidates"])
    assert labels == ["SYNTH HRM-A1", "SYNTH HRM-B2", "SYNTH HRM-C3"]
    assert re.search(r"([0-9A-F]{2}:){5}[0-9A-F]{2}", done.stdout.upper()) is None, "no address ever"
    assert all("address" not in c for c in status["result"]["candidates"])
    assert_valid_polls([status])
    # The shipped catalog is signed by the published test key, and stderr says so (stdout stays the status).
    notes = [line for line in done.stderr.splitlines() if "published test key" in line]
    assert len(notes) == 1 and "26d160dae106b7bb" in notes[0] and "tests and demos only" in notes[0]


@pytest.mark.realtime  # a `python -m connector scan` process
def test_a_scan_without_json_prints_a_table_and_a_summary() -> None:
    done = scan(
        "--transport",
        "usb-serial",
        "--window",
        "1",
        "--filter",
        "vid_pid=0403:6001",
        "--replay",
        "hw-fixtures/usb-serial-lab-rack.jsonl",
        "--replay-speed",
        "30",
    )
    assert done.returncode == 0, done.stderr
    assert "completed (window-complete): 2 candidate(s)" in done.stdout
    assert "FT232R USB UART" in done.stdout
    assert "/dev/tty" not in done.stdout and "SYNTHFT" not in done.stdout


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--transport", "ble", "--window", "1", "--filter", "colour=blue"], "invalid-input"),
        (["--transport", "ble", "--window", "1"], "invalid-input"),
        (["--transport", "ble", "--window", "999", "--filter", "service_uuid=180d"], "invalid-input"),
        (["--transport", "ble"], "--window"),
        (["--transport", "zigbee", "--window", "1"], "--transport"),
        (
            [
                "--transport",
                "ble",
                "--window",
                "1",
                "--filter",
                "service_uuid=180d",
                "--replay",
                HRM_LAB,
                "--replay-speed",
                "0",
            ],
            "replay speed",
        ),
        (
            [
                "--transport",
                "mdns",
                "--window",
                "1",
                "--filter",
                "service_type=_http._tcp",
                "--replay",
                HRM_LAB,
            ],
            "transport",
        ),
        (
            [
                "--transport",
                "ble",
                "--window",
                "1",
                "--filter",
                "service_uuid=180d",
                "--catalog",
                "nowhere.json",
            ],
            "catalog-missing",
        ),
        (
            ["--transport", "ble", "--window", "1", "--filter", "service_uuid=180d", "--trust", "tests"],
            "catalog-unknown-key",
        ),
        (
            [
                "--transport",
                "mdns",
                "--window",
                "1",
                "--filter",
                "service_type=_http._tcp",
                "--mdns-interfaces",
                "not-an-ip",
            ],
            "expects IP addresses separated by commas, or all",
        ),
    ],
)
def test_usage_and_input_errors_exit_2_with_one_line(
    args: list[str], reason: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    code: int | str | None
    try:
        code = main(["scan", *args])
    except SystemExit as exit_:
        code = exit_.code  # argparse's own refusals
    captured = capsys.readouterr()
    assert code == 2, (captured.out, captured.err)
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and reason in lines[0], captured.err


@pytest.mark.realtime  # a `python -m connector scan` process
def test_a_usage_error_exits_2_as_a_process_too() -> None:
    done = scan("--transport", "ble", "--window", "1", "--filter", "name_prefix=", "--filter", "CANARY-91=x")
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert "invalid-input" in done.stderr and "CANARY-91" not in done.stderr


@pytest.mark.realtime  # a `python -m connector scan` process
def test_sigint_cancels_and_waits_for_the_confirmed_stop() -> None:
    # 42 Microsoft advertisers: under max_candidates, so only Ctrl-C can end this 20 s window early.
    args = f"--transport ble --window 20 --filter manufacturer_id=6 --replay {OFFICE}"
    process = subprocess.Popen(
        [sys.executable, "-m", "connector", "scan", *args.split(), "--json"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert "scanning" in line, line
        time.sleep(0.8)  # real peer: the scan process; nothing it prints says it is running
        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, stderr
    assert time.monotonic() - started < 10  # a sanity cap: "cancelled" shows Ctrl-C, not the window, ended it
    status = json.loads(stdout)
    assert status["status"] == "cancelled"
    assert status["cancellation"]["state"] == "confirmed"
    assert status["cleanup"] == {"state": "confirmed", "claim": "released"}
    assert_valid_polls([status])


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("fixture", "scope"),
    [
        ("ble-mixed-bench.jsonl", ble_scope(filters=ScopeFilter(manufacturer_ids=(0x0059,)))),
        (
            "usb-serial-bench-hotplug.jsonl",
            ble_scope(transport="usb-serial", filters=ScopeFilter(vid_pid=USB_IDS)),
        ),
        ("mdns-home-network.jsonl", ble_scope(transport="mdns", filters=ScopeFilter(service_types=CAST))),
    ],
)
async def test_the_live_view_renders_each_transport_without_addresses(
    fixture: str, scope: DiscoveryScope
) -> None:
    async with fast_manager() as manager:
        handle = await start(manager, ReplayProvider(REPO / "hw-fixtures" / fixture, speed=40.0), scope=scope)
        polls = await poll_to_end(manager, handle.operation_id)
    status = next(p for p in reversed(polls) if "progress" in p)
    console = Console(file=io.StringIO(), width=160, color_system=None)
    console.print(render_live(status, scope, int(time.time() * 1000) - 200))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    labels = [c["label"] for c in status["progress"]["snapshot"]["candidates"]]
    assert labels and all(label[:20] in text for label in labels)
    assert re.search(r"([0-9A-F]{2}:){5}[0-9A-F]{2}", text.upper()) is None
    assert "/dev/" not in text and "192.0.2." not in text
