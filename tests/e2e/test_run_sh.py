"""`scripts/run.sh` and this machine's operator key (CONTRACT §12): made once, the example signed once, an
edited example not adopted until the operator signs it with the command run.sh prints."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support.paths import REPO, SHIPPED_CATALOG

pytestmark = pytest.mark.serve

_SERVING = re.compile(r"serving on (http://127\.0\.0\.1:\d+)")
_CALLER = re.compile(r"^caller token \(principal 'bench'\):\s+(\S+)$", re.M)
CLI = ".venv/bin/sensorium-connector"
_CREATED = re.compile(r"^created this machine's operator key ([0-9a-f]{16}): ", re.M)


@contextmanager
def _running(data_dir: Path, example: Path, log: Path) -> Iterator[tuple[str, str]]:
    """`scripts/run.sh --port 0` until the block ends; yields its output once it serves, and its URL."""
    env = {**os.environ, "SENSORIUM_DATA_DIR": str(data_dir), "SENSORIUM_EXAMPLE_CATALOG": str(example)}
    with log.open("wb") as sink:
        process = subprocess.Popen(
            ["bash", "scripts/run.sh", "--port", "0"],
            cwd=REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**env, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
    try:
        yield _serving(process, log)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
        code = process.wait(timeout=30)
    assert code == 0, log.read_text(errors="replace")  # SIGTERM: sessions stopped, a clean exit


def _serving(process: subprocess.Popen[bytes], log: Path) -> tuple[str, str]:
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        found = _SERVING.search(text)
        if found:
            return text, found.group(1)
        assert process.poll() is None, text
        time.sleep(0.2)  # real peer: polls a real serve's log
    raise AssertionError(log.read_text(errors="replace"))


def _served_version(url: str, token: str) -> int:
    """`catalog/version` of the catalog the running server verified."""
    response = httpx.get(url + "/v1/catalog", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert response.status_code == 200, response.text
    version: int = response.json()["catalog/version"]
    return version


@pytest.mark.timeout(600)
def test_run_sh_makes_one_key_signs_the_example_once_and_does_not_adopt_an_edit(tmp_path: Path) -> None:
    data_dir, example = tmp_path / "state", tmp_path / "actions.json"
    example.write_bytes(SHIPPED_CATALOG.read_bytes())
    with _running(data_dir, example, tmp_path / "first.log") as (first, url):
        token = _CALLER.search(first).group(1)  # type: ignore[union-attr]
        assert _served_version(url, token) == 1
    created = _CREATED.findall(first)
    assert len(created) == 1, first
    key_id = created[0]
    key = data_dir / "operator-key" / f"{key_id}.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert sorted(p.name for p in (data_dir / "trust").iterdir()) == [f"{key_id}.pub"]
    signed = data_dir / "catalog" / "actions.json"
    signature = signed.with_name("actions.json.sig")
    assert signed.read_bytes() == example.read_bytes()
    assert json.loads(signature.read_text())["key/id"] == key_id
    assert f"signed by this machine's key {key_id}" in first and "test key" not in first
    before = {path: path.read_bytes() for path in (key, signed, signature)}

    with _running(data_dir, example, tmp_path / "second.log") as (second, _):
        pass
    assert not _CREATED.search(second) and "signed a copy" not in second and "changed" not in second
    assert {path: path.read_bytes() for path in before} == before
    assert f"signed by this machine's key {key_id}" in second

    edited = json.loads(example.read_text())
    edited["catalog/version"] += 1
    example.write_text(json.dumps(edited, indent=2) + "\n")
    with _running(data_dir, example, tmp_path / "third.log") as (third, url):
        assert _served_version(url, token) == 1  # still the signed copy: the edit is not adopted by itself
    assert f"{example} changed since it was signed for this machine" in third, third
    assert {path: path.read_bytes() for path in before} == before
    adopt = next(line.strip() for line in third.splitlines() if " catalog sign " in line)
    assert f"--key {key}" in adopt
    done = subprocess.run(["bash", "-c", adopt], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(signed.read_text())["catalog/version"] == edited["catalog/version"]
    verify = [CLI, "catalog", "verify", str(signed), "--trust", str(data_dir / "trust")]
    verified = subprocess.run(verify, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert verified.returncode == 0 and key_id in verified.stdout and verified.stderr == "", verified.stderr
