"""`serve`'s trust and policy flags (CONTRACT §0, §3, §12): the published test key, `--host-policy FILE`."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from connector.cli import serve_cmd, serve_flags
from connector.cli.main import build_parser, main
from connector.core.policy import DeferredHostPolicy
from connector.testing import wait_serving
from tests.support.catalogs import signed_catalog
from tests.support.paths import REPO, SHIPPED_TRUST
from tests.support.serving import cli_argv, cli_env, spawn


def _serve(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """`serve ARGS` as a process in the repository root, expected to exit on its own."""
    argv = cli_argv("serve", "--host", "127.0.0.1", "--port", "0", *args)
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60, env=cli_env())


def _refused_for_the_test_key(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "catalog refused (catalog-test-key)" in lines[0], done.stderr
    assert "--allow-test-key" in lines[0] and "serving on" not in done.stderr


@pytest.mark.serve
def test_serve_with_the_shipped_trust_and_no_flag_exits_2_catalog_test_key(tmp_path: Path) -> None:
    _refused_for_the_test_key(_serve("--data-dir", tmp_path / "data"))
    assert not (tmp_path / "data").exists()  # refused before any state was made


@pytest.mark.serve
def test_simulate_with_a_named_catalog_signed_by_the_test_key_is_refused_too(tmp_path: Path) -> None:
    catalog = signed_catalog(tmp_path / "catalog")
    trust = tmp_path / "trust"
    shutil.copytree(SHIPPED_TRUST, trust)
    args = ("--data-dir", tmp_path / "data", "--catalog", catalog, "--trust", trust, "--simulate")
    _refused_for_the_test_key(_serve(*args))


@pytest.mark.serve
def test_simulate_without_a_catalog_serves_the_packaged_example_without_the_flag(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    argv = cli_argv("serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", tmp_path / "data")
    process = spawn([*argv, "--simulate", "--mdns-interfaces", "127.0.0.1"], log)
    try:
        url = wait_serving(process, log, 60)
        assert httpx.get(url + "/healthz", timeout=10).status_code == 200
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0
    text = log.read_text()
    assert "(catalog sensorium-os.example v1)" in text and "catalog-test-key" not in text


def _policy_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.json"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('{"max_attempts": 5, "max_attemps": 5}', "max_attemps (unknown-key)"),
        ('{"jitter_fraction": 1.0}', "jitter_fraction (out-of-range)"),
        ('{"jitter_fraction": -0.1}', "jitter_fraction (out-of-range)"),
        ('{"max_ttl_seconds": -1}', "max_ttl_seconds (out-of-range)"),
        ('{"max_attempts": 2.5}', "max_attempts (not-an-integer)"),
        ('{"max_attempts": true}', "max_attempts (not-an-integer)"),
        ('{"min_retry_after_seconds": 61}', "min_retry_after_seconds (min-above-max)"),
        ("[1]", "must hold a JSON object"),
        ('{"max_attempts": 5, "max_attempts": 6}', "is not a well-formed JSON document"),
        ('{"jitter_fraction": NaN}', "is not a well-formed JSON document"),
    ],
)
def test_a_refused_host_policy_exits_2_naming_the_key(
    text: str, named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _policy_file(tmp_path, text)
    code = main(["serve", "--data-dir", str(tmp_path / "data"), "--host-policy", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and named in err and err.count("\n") == 1, err


def test_a_missing_host_policy_file_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["serve", "--data-dir", str(tmp_path), "--host-policy", str(tmp_path / "nope.json")])
    assert code == 2 and "nope.json does not exist" in capsys.readouterr().err


def test_a_host_policy_file_overrides_only_its_fields(tmp_path: Path) -> None:
    path = _policy_file(tmp_path, '{"max_attempts": 5, "jitter_fraction": 0, "max_retry_after_seconds": 30}')
    args = build_parser().parse_args(["serve", "--host-policy", str(path)])
    policy = serve_cmd.config_from(args).host_policy
    assert policy == dataclasses.replace(
        DeferredHostPolicy(), max_attempts=5, jitter_fraction=0, max_retry_after_seconds=30
    )
    assert serve_cmd.config_from(build_parser().parse_args(["serve"])).host_policy == DeferredHostPolicy()


def test_serve_help_lists_every_policy_field_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--host-policy FILE" in text and "--allow-test-key" in text and "--allowed-host NAME" in text
    for field in dataclasses.fields(DeferredHostPolicy):
        assert f"{field.name}={field.default}" in text.replace("- ", "-"), field.name


def test_the_policy_file_is_read_as_json_not_as_a_directive(tmp_path: Path) -> None:
    """A fraction is fine here (jitter_fraction): directives' integer-only rule does not apply."""
    path = _policy_file(tmp_path, json.dumps({"jitter_fraction": 0.25}))
    assert serve_flags.host_policy_from(path).jitter_fraction == 0.25
