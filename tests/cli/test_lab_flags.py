"""Node and lab flags refused before anything starts (CONTRACT §12, §15): exit 2, a one-line reason."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from connector.cli.lab_cmd import read_nodes
from connector.cli.main import build_parser
from connector.cli.serve_cmd import config_from
from tests.support.paths import REPO
from tests.support.serving import cli_argv, cli_env


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli_argv(*args), cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--node", "a"], "--node needs --nats"),
        (["--nats", "nats://127.0.0.1:4222", "--node", "Bad.Name"], "--node takes a name"),
        (["--nats", "nats://10.0.0.5:4222", "--node", "a"], "needs --nats-creds and --nats-tls-ca"),
        (["--nats", "nats://127.0.0.1:4222,ftp://x"], "--nats takes a broker URL"),
    ],
)
def test_serve_refuses_bad_node_flags(tmp_path: Path, args: list[str], reason: str) -> None:
    parsed = build_parser().parse_args(["serve", "--simulate", "--data-dir", str(tmp_path / "d"), *args])
    with pytest.raises(ValueError, match=re.escape(reason)):
        config_from(parsed)


@pytest.mark.serve
def test_serve_takes_a_remote_broker_when_told_insecure_and_exits_2_otherwise(tmp_path: Path) -> None:
    remote = ["serve", "--simulate", "--data-dir", str(tmp_path / "d"), "--nats", "nats://10.0.0.5:4222"]
    config = config_from(build_parser().parse_args([*remote, "--node", "a", "--nats-insecure"]))
    assert (config.nats_url, config.nats_node) == ("nats://10.0.0.5:4222", "a")
    assert config_from(build_parser().parse_args(["serve", "--simulate"])).nats_node is None
    result = _run(*remote, "--node", "a", "--port", "0")
    assert result.returncode == 2
    assert "--nats-insecure" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def _nodes(path: Path, body: object, mode: int = 0o600) -> Path:
    path.write_text(json.dumps(body))
    os.chmod(path, mode)
    return path


def test_the_nodes_file_must_be_private_json_of_node_names(tmp_path: Path) -> None:
    assert read_nodes(_nodes(tmp_path / "ok.json", {"a": "t1", "rf-room": "t2"})) == {
        "a": "t1",
        "rf-room": "t2",
    }
    with pytest.raises(ValueError, match="make it 0600"):
        read_nodes(_nodes(tmp_path / "open.json", {"a": "t"}, 0o644))
    with pytest.raises(ValueError, match="JSON object"):
        read_nodes(_nodes(tmp_path / "list.json", ["a"]))
    with pytest.raises(ValueError, match="--node takes a name"):
        read_nodes(_nodes(tmp_path / "name.json", {"A B": "t"}))
    with pytest.raises(ValueError, match="not JSON"):
        (tmp_path / "bad.json").write_text("{")
        os.chmod(tmp_path / "bad.json", 0o600)
        read_nodes(tmp_path / "bad.json")


@pytest.mark.realtime  # a `python -m connector lab` process
def test_lab_exits_2_on_an_open_nodes_file_or_a_remote_broker_without_tls(tmp_path: Path) -> None:
    open_file = _nodes(tmp_path / "nodes.json", {"a": "t"}, 0o644)
    result = _run(
        "lab", "--nats", "nats://127.0.0.1:4222", "--nodes", open_file, "--data-dir", tmp_path / "d"
    )
    assert result.returncode == 2 and "0600" in result.stderr
    private = _nodes(tmp_path / "private.json", {"a": "t"})
    result = _run("lab", "--nats", "nats://10.0.0.5:4222", "--nodes", private, "--data-dir", tmp_path / "d")
    assert result.returncode == 2 and "--nats-insecure" in result.stderr
