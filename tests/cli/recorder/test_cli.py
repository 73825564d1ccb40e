"""`sensorium-connector fixtures record`: exit codes, refusals that echo no values, the file it leaves."""

from __future__ import annotations

import json
import select
import signal
import subprocess
from pathlib import Path

import pytest

from connector.cli.main import COMMAND_MODULES, main
from tests.cli.recorder.support import fixture_lines, run_cli, spawn_cli
from tests.providers.bluez_mock import (
    BluezController,
    BluezEmulator,
    bluez,
    bluez_available,
    every_advert,
)
from tests.support.directives import HEART_RATE

__all__ = ["bluez", "every_advert"]  # the fixtures, imported above

CANARY = "canary-7f3a"
DEVICE = "AA:BB:CC:00:00:0A"


def first_line(child: subprocess.Popen[str], timeout_s: float = 15.0) -> str:
    """The child's first stderr line, waiting at most `timeout_s`."""
    assert child.stderr is not None
    ready, _, _ = select.select([child.stderr], [], [], timeout_s)
    assert ready, "the recorder said nothing in time"
    return child.stderr.readline()


def finish(child: subprocess.Popen[str], timeout_s: float = 20.0) -> tuple[int, str]:
    """Exit code and the rest of stderr."""
    try:
        _, stderr = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise
    return child.returncode, stderr


def record_args(target: Path, *extra: str, seconds: int = 2) -> list[str]:
    return ["fixtures", "record", "--transport", "ble", "--seconds", str(seconds), "-o", str(target), *extra]


def test_the_command_is_registered_with_the_cli() -> None:
    assert "connector.cli.fixtures_cmd" in COMMAND_MODULES


def test_a_bad_transport_is_a_usage_error_that_does_not_echo_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run_cli(["fixtures", "record", "--transport", CANARY, "--seconds", "1", "-o", "x.jsonl"])
    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and "--transport" in stderr and CANARY not in stderr


ADAPTER_BLE_ONLY = "--adapter applies to --transport ble only (USB and mDNS have no adapter to choose)"


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--seconds", "0"], "--seconds"),
        (["--seconds", "3601"], "--seconds"),
        (["--seconds", CANARY], "--seconds"),
    ],
)
def test_seconds_out_of_range_are_usage_errors(
    extra: list[str], flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run_cli(["fixtures", "record", "--transport", "ble", "-o", str(tmp_path / "x.jsonl"), *extra])
    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    assert flag in stderr and CANARY not in stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("transport", "extra", "reason"),
    [
        ("ble", ["--service-type", "_http._tcp"], "--service-type applies to --transport mdns only"),
        ("usb-serial", ["--adapter", "hci0"], ADAPTER_BLE_ONLY),
        ("ble", ["--mdns-interfaces", "127.0.0.1"], "--mdns-interfaces applies to --transport mdns only"),
        ("mdns", ["--service-type", f"_{CANARY}"], "--service-type: service-type"),
        ("ble", ["--adapter", f"{CANARY}/x"], "--adapter: adapter-name"),
    ],
)
def test_flags_are_checked_before_any_provider_starts(
    transport: str, extra: list[str], reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["fixtures", "record", "--transport", transport, "--seconds", "1", "-o", str(tmp_path / "x.jsonl")]
    assert run_cli([*argv, *extra]) == 2
    stderr = capsys.readouterr().err
    assert stderr == f"sensorium-connector: fixtures record: {reason}\n"
    assert list(tmp_path.iterdir()) == []


def test_the_output_must_be_a_file_in_an_existing_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(record_args(tmp_path / CANARY / "x.jsonl")) == 2
    assert run_cli(record_args(tmp_path)) == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 2 and CANARY not in stderr and str(tmp_path) not in stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.realtime  # a CLI process on a private dbus-daemon
@pytest.mark.skipif(not bluez_available(), reason="dbus-daemon is not installed")
def test_no_ble_adapter_exits_1_with_the_code_and_writes_nothing(tmp_path: Path) -> None:
    with BluezEmulator():  # bluetoothd runs, but the private bus has no adapter
        code, stderr = finish(spawn_cli(record_args(tmp_path / "x.jsonl")))
    assert code == 1
    *_, reason, hint = stderr.strip().splitlines()
    assert reason.startswith("sensorium-connector: fixtures record: provider-unavailable:")
    assert hint.startswith("hint:") and "bluetoothctl show" in hint
    assert "rfkill" in hint and "--replay" in hint
    assert "recording for" not in stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.usefixtures("every_advert")  # two reports of one device within one scan
def test_a_recording_exits_0_and_leaves_a_private_pseudonymised_file(
    bluez: BluezController, tmp_path: Path
) -> None:
    target = tmp_path / "bench.jsonl"
    # 5 s: the two reports must land inside the window after a worker process starts on a loaded machine.
    notes = ("--notes", "one strap on the bench")
    child = spawn_cli(record_args(target, "--adapter", "hci0", *notes, seconds=5))
    assert first_line(child).startswith("fixtures record: recording for 5 s")
    bluez.add_device(DEVICE, name="strap", rssi=-60, service_uuids=[HEART_RATE])
    bluez.update(DEVICE, rssi=-55)
    code, stderr = finish(child)
    assert code == 0, stderr
    assert "wrote 2 observation line(s) with pseudonymised identities" in stderr
    assert target.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.jsonl"]
    header, *lines = fixture_lines(target)
    assert header["fixture"] == "sensorium-hw-fixture.v1" and header["transport"] == "ble"
    assert header["source"] == "recorded" and header["adapter"] == "hci0"
    assert header["recorded_at"].endswith("Z") and len(header["recorded_at"]) == 20
    assert header["notes"].startswith("one strap on the bench")
    assert {"bleak", "zeroconf", "pyserial", "python", "sensorium-os-connector"} == set(header["versions"])
    assert [line["rssi"] for line in lines] == [-60, -55] and lines[0]["address"] == lines[1]["address"]
    assert DEVICE not in target.read_text() and DEVICE.lower() not in target.read_text()
    assert not bluez.discovering()


def test_kept_identities_are_in_the_file(bluez: BluezController, tmp_path: Path) -> None:
    target = tmp_path / "kept.jsonl"
    child = spawn_cli(record_args(target, "--keep-identities", seconds=1))
    first_line(child)
    bluez.add_device(DEVICE, name="strap", rssi=-60)
    code, stderr = finish(child)
    assert code == 0, stderr
    assert "with real identities" in stderr
    assert [line["address"] for line in fixture_lines(target)[1:]] == [DEVICE]
    assert json.loads(target.read_text().splitlines()[0])["notes"].endswith("identities kept (do not share)]")


def test_ctrl_c_aborts_confirms_the_stop_exits_130_and_keeps_nothing(
    bluez: BluezController, tmp_path: Path
) -> None:
    target = tmp_path / "aborted.jsonl"
    child = spawn_cli(record_args(target, seconds=60))
    first_line(child)
    bluez.add_device(DEVICE, name="strap", rssi=-60)
    child.send_signal(signal.SIGINT)
    code, stderr = finish(child)
    assert code == 130, stderr
    assert "aborted; nothing was written" in stderr
    assert list(tmp_path.iterdir()) == []
    assert not bluez.discovering()


def test_the_real_entry_point_refuses_a_bad_transport(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fixtures", "record", "--transport", CANARY, "--seconds", "1", "-o", "x.jsonl"])
    assert exit_info.value.code == 2
    expected = "sensorium-connector: fixtures record: argument --transport: invalid choice\n"
    assert capsys.readouterr().err == expected
