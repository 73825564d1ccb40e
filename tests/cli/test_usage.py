"""The small usage promises: a top-level help for users, `run.sh --help` that creates nothing, a clamped
`--max-candidates` said on stderr, `serve --replay` refusing another transport's fixture, and where
`serve --simulate` takes its catalog from (CONTRACT §0, §12)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from connector.cli.main import main
from connector.cli.serve_cmd import catalog_paths, parse_replays
from connector.resources import example_catalog, example_trust
from tests.cli.test_scan import scan
from tests.support.paths import HW_FIXTURES, REPO

BLE_FIXTURE = HW_FIXTURES / "ble-heart-rate-lab.jsonl"


def test_the_top_level_help_is_written_for_a_user(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "common tasks:" in text and "serve --simulate" in text and "exit codes" in text
    assert "subcommands register themselves" not in text


@pytest.mark.realtime  # runs scripts/run.sh
def test_run_sh_help_prints_help_and_creates_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "never-created"
    env = {**os.environ, "SENSORIUM_DATA_DIR": str(data_dir)}
    done = subprocess.run(
        [str(REPO / "scripts" / "run.sh"), "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "run the connector service" in done.stdout and "usage: sensorium-connector serve" in done.stdout
    assert not data_dir.exists() and "caller token (principal" not in done.stdout


@pytest.mark.realtime  # a `python -m connector scan` process
def test_a_clamped_max_candidates_is_said_on_stderr() -> None:
    done = scan(
        "--transport",
        "ble",
        "--window",
        "1",
        "--filter",
        "service_uuid=180d",
        "--max-candidates",
        "100",
        "--replay",
        str(BLE_FIXTURE),
        "--replay-speed",
        "20",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    assert "--max-candidates 100 is more than the catalog allows; stopping after 64" in done.stderr
    assert json.loads(done.stdout)["progress"]["bounds"]["max_candidates"] == 64


def test_serve_replay_refuses_a_fixture_of_another_transport(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="records ble, not usb-serial"):
        parse_replays([f"usb-serial={BLE_FIXTURE}"])
    code = main(["serve", "--port", "0", "--replay", f"mdns={BLE_FIXTURE}"])
    assert code == 2 and "the fixture records ble, not mdns" in capsys.readouterr().err


def test_serve_simulate_without_a_catalog_serves_the_packaged_example() -> None:
    assert catalog_paths(None, None, ("ble",)) == (example_catalog(), example_trust())
    assert catalog_paths(None, None, ()) == (Path("catalog/actions.json"), Path("catalog/trust"))
    mine = Path("mine.json")
    assert catalog_paths(mine, Path("keys"), ("ble",)) == (mine, Path("keys"))
    with pytest.raises(ValueError, match="--trust needs --catalog"):
        catalog_paths(None, Path("keys"), ("ble",))
