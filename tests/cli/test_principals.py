"""`principals add | revoke | list`: the token is printed once, alone on the last line; no secret listed."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from connector.cli import principals_cmd
from connector.core.authority import hash_token
from connector.errors import SensoriumError
from connector.storage.principals import PrincipalDirectory, principals_path

SCAN = "device.discovery.scan"
REDACT = "whisper.redaction.prepare"


def run(argv: list[str]) -> int:
    """Run the `principals` command through its own parser (the same `register` main() uses)."""
    parser = argparse.ArgumentParser(prog="sensorium-connector")
    principals_cmd.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


def add(data: Path, capsys: pytest.CaptureFixture[str], *extra: str, pid: str = "alice") -> str:
    assert run(["principals", "add", "--data-dir", str(data), "--id", pid, *extra]) == 0
    out = capsys.readouterr().out
    return out.splitlines()[-1]


def test_add_prints_the_token_once_on_the_last_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run(
        [
            "principals",
            "add",
            "--data-dir",
            str(tmp_path),
            "--id",
            "alice",
            "--role",
            "caller",
            "--grant",
            f"{SCAN}:ble,mdns",
            "--grant",
            REDACT,
        ]
    )
    captured = capsys.readouterr()
    assert code == 0
    lines = captured.out.splitlines()
    token = lines[-1]
    assert token.strip() == token and " " not in token and len(token) >= 43
    assert captured.out.count(token) == 1
    assert token not in captured.err
    assert all(token not in line for line in lines[:-1])
    raw = principals_path(tmp_path).read_text()
    assert token not in raw and hash_token(token) in raw
    principal = PrincipalDirectory(tmp_path).authenticate(token)
    assert [g.action_id for g in principal.grants] == [SCAN, REDACT]
    assert principal.grants[0].transports == ("ble", "mdns")


def test_list_shows_no_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    alice = add(tmp_path, capsys, "--role", "caller", "--grant", f"{SCAN}:ble")
    ops = add(tmp_path, capsys, "--role", "operator", pid="ops")
    assert run(["principals", "list", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "id\trole\tstate\tgrants",
        f"alice\tcaller\tactive\t{SCAN}:ble",
        "ops\toperator\tactive\t-",
    ]
    for token in (alice, ops):
        assert token not in out and hash_token(token) not in out


def test_revoke_one_grant_and_everything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = add(tmp_path, capsys, "--role", "caller", "--grant", SCAN, "--grant", REDACT)
    assert run(["principals", "revoke", "--data-dir", str(tmp_path), "--id", "alice", "--grant", SCAN]) == 0
    assert run(["principals", "list", "--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"alice\tcaller\tactive\t{REDACT}"
    assert run(["principals", "revoke", "--data-dir", str(tmp_path), "--id", "alice"]) == 0
    assert run(["principals", "list", "--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "alice\tcaller\trevoked\t-"
    with pytest.raises(SensoriumError) as refused:
        PrincipalDirectory(tmp_path).authenticate(token)
    assert refused.value.code == "unauthenticated"


@pytest.mark.parametrize(
    "argv",
    [
        ["add", "--id", "alice", "--role", "caller"],  # duplicate id (alice exists)
        ["add", "--id", "carol", "--role", "admin"],
        ["add", "--id", "bad id", "--role", "caller"],
        ["add", "--id", "carol", "--role", "caller", "--grant", "device.discovery.scan:wifi"],
        ["add", "--id", "carol", "--role", "caller", "--grant", SCAN, "--grant", f"{SCAN}:ble"],
        ["add", "--id", "carol", "--role", "operator", "--grant", SCAN],
        ["revoke", "--id", "nobody"],
        ["revoke", "--id", "alice", "--grant", REDACT],
    ],
)
def test_usage_errors_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    add(tmp_path, capsys, "--role", "caller", "--grant", SCAN)
    before = principals_path(tmp_path).read_bytes()
    assert run(["principals", argv[0], "--data-dir", str(tmp_path), *argv[1:]]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1
    assert principals_path(tmp_path).read_bytes() == before


def test_malformed_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    principals_path(tmp_path).write_text('{"schema": "CANARY"}')
    assert run(["principals", "list", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "CANARY" not in err


@pytest.mark.realtime  # a `python -m connector` process
def test_through_the_console_entry(tmp_path: Path, repo_root: Path) -> None:
    data = tmp_path / "d"
    env = {**os.environ, "PYTHONPATH": str(repo_root)}
    argv = [
        sys.executable,
        "-m",
        "connector",
        "principals",
        "add",
        "--data-dir",
        str(data),
        "--id",
        "alice",
        "--role",
        "caller",
        "--grant",
        SCAN,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    token = done.stdout.splitlines()[-1]
    assert done.stdout.count(token) == 1
    listed = subprocess.run(
        [sys.executable, "-m", "connector", "principals", "list", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0
    assert token not in listed.stdout and hash_token(token) not in listed.stdout
    assert json.loads(principals_path(data).read_text())["principals"][0]["id"] == "alice"
