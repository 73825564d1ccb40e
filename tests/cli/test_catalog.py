"""`catalog keygen | sign | verify`: exit codes 0/1/2, output, and refusals that echo no catalog content."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from connector.catalog.state import highest_accepted_version
from connector.cli import catalog_cmd
from tests.catalog.helpers import CANARY
from tests.support.catalogs import example_catalog
from tests.support.paths import REPO, SHIPPED_CATALOG


def main(argv: list[str]) -> int:
    """The `catalog` command alone, so that other commands' state cannot affect these tests."""
    parser = argparse.ArgumentParser(prog="sensorium-connector")
    catalog_cmd.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the CLI in-process; answer exit code, stdout, stderr."""
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def keygen_and_trust(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> tuple[Path, Path]:
    """A key pair made by the CLI; answer its private key path and a trust dir with its public half."""
    code, out, _ = run(capsys, "catalog", "keygen", "--out", str(tmp_path / "keys"))
    assert code == 0
    key_id = out.strip()
    trust = tmp_path / "trust"
    trust.mkdir()
    shutil.copy(tmp_path / "keys" / f"{key_id}.pub", trust / f"{key_id}.pub")
    return tmp_path / "keys" / f"{key_id}.key", trust


def write_catalog(path: Path, version: int = 1) -> None:
    """Write the example catalog with the given version."""
    catalog = example_catalog()
    catalog["catalog/version"] = version
    path.write_text(json.dumps(catalog, indent=2) + "\n", encoding="utf-8")


def test_keygen_prints_only_the_key_id(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "catalog", "keygen", "--out", str(tmp_path))
    key_id = out.strip()
    assert code == 0 and err == ""
    assert len(key_id) == 16 and all(c in "0123456789abcdef" for c in key_id)
    assert {p.name for p in tmp_path.iterdir()} == {f"{key_id}.pub", f"{key_id}.key"}


def test_sign_then_verify(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    key, trust = keygen_and_trust(capsys, tmp_path)
    catalog = tmp_path / "actions.json"
    write_catalog(catalog)
    code, out, _ = run(capsys, "catalog", "sign", str(catalog), "--key", str(key))
    assert code == 0 and (tmp_path / "actions.json.sig").is_file()
    assert key.stem in out
    code, out, err = run(capsys, "catalog", "verify", str(catalog), "--trust", str(trust))
    assert code == 0 and err == ""
    assert out.count("\n") == 1
    assert "sensorium-os.example" in out and "version 1" in out and "3 actions" in out


def test_verify_says_on_stderr_when_the_published_test_key_signed(capsys: pytest.CaptureFixture[str]) -> None:
    trust = REPO / "catalog" / "trust"
    code, out, err = run(capsys, "catalog", "verify", str(SHIPPED_CATALOG), "--trust", str(trust))
    assert code == 0 and "signed by key 26d160dae106b7bb" in out and out.count("\n") == 1
    assert err.count("\n") == 1 and "published test key 26d160dae106b7bb" in err and "tests and demos" in err


def test_verify_refusal_exits_1_with_the_code_and_no_content(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    key, trust = keygen_and_trust(capsys, tmp_path)
    catalog = tmp_path / "actions.json"
    write_catalog(catalog)
    run(capsys, "catalog", "sign", str(catalog), "--key", str(key))
    tampered = json.loads(catalog.read_text(encoding="utf-8"))
    tampered["actions"][2]["description"] = CANARY
    catalog.write_text(json.dumps(tampered), encoding="utf-8")
    code, out, err = run(capsys, "catalog", "verify", str(catalog), "--trust", str(trust))
    assert code == 1 and out == ""
    assert "catalog-bad-signature" in err and err.count("\n") == 1
    assert CANARY not in err


def test_verify_unsigned_exits_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _, trust = keygen_and_trust(capsys, tmp_path)
    catalog = tmp_path / "actions.json"
    write_catalog(catalog)
    code, _, err = run(capsys, "catalog", "verify", str(catalog), "--trust", str(trust))
    assert code == 1 and "catalog-unsigned" in err


def test_verify_with_data_dir_records_and_refuses_rollback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    key, trust = keygen_and_trust(capsys, tmp_path)
    catalog, data_dir = tmp_path / "actions.json", tmp_path / "data"
    for version, expected_code in ((2, 0), (2, 0), (1, 1), (3, 0)):
        write_catalog(catalog, version)
        run(capsys, "catalog", "sign", str(catalog), "--key", str(key))
        code, _, err = run(
            capsys, "catalog", "verify", str(catalog), "--trust", str(trust), "--data-dir", str(data_dir)
        )
        assert code == expected_code
        assert ("catalog-rollback" in err) == (expected_code == 1)
    assert highest_accepted_version(data_dir, "sensorium-os.example") == 3


def test_verify_defaults_to_the_trust_dir_under_the_cwd(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    code, out, _ = run(capsys, "catalog", "verify", "catalog/actions.json")
    assert code == 0 and "sensorium-os.example" in out


def test_verify_without_a_trust_dir_under_the_cwd_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "catalog", "verify", str(SHIPPED_CATALOG))
    assert code == 2 and out == "" and "trust directory" in err


@pytest.mark.parametrize(
    "argv",
    [
        ("catalog", "verify", "{tmp}/absent.json", "--trust", "{tmp}"),
        ("catalog", "sign", "{tmp}/absent.json", "--key", "{tmp}/absent.key"),
        ("catalog", "sign", "{catalog}", "--key", "{tmp}/absent.key"),
        ("catalog", "verify", "{catalog}", "--trust", "{catalog}"),
        ("catalog", "verify", "{catalog}", "--trust", "{tmp}", "--data-dir", "{catalog}"),
        ("catalog", "keygen", "--out", "{catalog}"),
    ],
    ids=[
        "verify-missing-catalog",
        "sign-missing-catalog",
        "sign-missing-key",
        "trust-is-a-file",
        "data-dir-is-a-file",
        "keygen-out-is-a-file",
    ],
)
def test_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: tuple[str, ...]
) -> None:
    catalog = tmp_path / "actions.json"
    write_catalog(catalog)
    code, out, err = run(capsys, *(a.format(tmp=tmp_path, catalog=catalog) for a in argv))
    assert code == 2 and out == ""
    assert err.startswith("sensorium-connector: ") and err.count("\n") == 1


def test_sign_refuses_a_malformed_catalog_with_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    key, _ = keygen_and_trust(capsys, tmp_path)
    catalog = tmp_path / "actions.json"
    catalog.write_text('{"schema": "' + CANARY + '"}', encoding="utf-8")
    code, _, err = run(capsys, "catalog", "sign", str(catalog), "--key", str(key))
    assert code == 2 and "catalog-malformed" in err and CANARY not in err
    assert not (tmp_path / "actions.json.sig").exists()


def test_argparse_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["catalog"], ["catalog", "keygen"], ["catalog", "sign", "x.json"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
    capsys.readouterr()


@pytest.mark.realtime  # a `python -m connector` process
def test_the_console_entry_point_verifies_the_shipped_catalog(tmp_path: Path) -> None:
    """End to end through `python -m connector`, i.e. `connector.cli.main` with every command registered."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "connector",
            "catalog",
            "verify",
            "catalog/actions.json",
            "--data-dir",
            str(tmp_path),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "sensorium-os.example" in completed.stdout
