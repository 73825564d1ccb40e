"""The README's commands, run as a reader would paste them.

The set-up is exactly two commands (`scripts/run.sh`, `scripts/test.sh`). The usage section's blocks are
extracted and run: the terminal scan of a bundled fixture, the `scripts/run.sh --replay ...` line (on a
random port and a private data dir, so nothing touches `.sensorium/` or port 8787) and the curl requests
against it, with the URL and the token `run.sh` printed put in. A second start says how to mint a token,
and the command it prints works.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.serve

README = (REPO / "README.md").read_text(encoding="utf-8")
_BLOCK = re.compile(r"```bash\n(.*?)```", re.S)
_SERVING = re.compile(r"serving on (http://127\.0\.0\.1:\d+)")
_CALLER = re.compile(r"^caller token \(principal 'bench'\):\s+(\S+)$", re.M)


def _section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def _blocks(title: str) -> list[str]:
    return [block.strip() for block in _BLOCK.findall(_section(title))]


def test_the_set_up_is_exactly_two_commands() -> None:
    assert _blocks("Run") == ["scripts/run.sh"]
    assert _blocks("Test") == ["scripts/test.sh"]


def _bash(
    script: str, *, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_the_terminal_scan_of_a_bundled_fixture_works() -> None:
    scan = next(block for block in _blocks("Usage") if " scan " in block and "--replay" in block)
    assert scan.startswith(".venv/bin/sensorium-connector scan ") and "\n" not in scan
    done = _bash(scan, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "completed (window-complete)" in done.stdout and "SYNTH HRM" in done.stdout


def _start_run_sh(line: str, data_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SENSORIUM_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as sink:
        return subprocess.Popen(
            ["bash", "-c", f"exec {line} --port 0"],
            cwd=REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def _wait(log: Path, process: subprocess.Popen[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if _SERVING.search(text):
            return text
        assert process.poll() is None, text
        time.sleep(0.1)  # real peer: the serve process writes its log
    raise AssertionError(log.read_text(errors="replace"))


def _stop(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    try:
        return process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.wait(timeout=10)


@pytest.mark.timeout(240)
def test_run_sh_with_replay_and_the_curl_requests_work(tmp_path: Path) -> None:
    blocks = _blocks("Usage")
    run_line = next(block for block in blocks if block.startswith("scripts/run.sh --replay"))
    curl = next(block for block in blocks if "curl" in block)
    data_dir = tmp_path / "state"
    first = _start_run_sh(run_line, data_dir, tmp_path / "first.log")
    try:
        text = _wait(tmp_path / "first.log", first, timeout=120)
        url = _SERVING.search(text).group(1)  # type: ignore[union-attr]
        token = _CALLER.search(text).group(1)  # type: ignore[union-attr]
        assert "next steps" in text and "/admin/deferred-operations" in text
        assert curl.count("URL=http://127.0.0.1:8787") == 1 and curl.count("TOKEN='") == 1
        script = re.sub(r"^URL=.*$", f"URL={url}", curl, flags=re.M)
        script = re.sub(r"^TOKEN=.*$", f"TOKEN='{token}'", script, flags=re.M)
        done = _bash(script, timeout=90)
        assert done.returncode == 0, (done.stdout, done.stderr)
        out = done.stdout
        assert '"schema":"deferred-operation-status.v2"' in out and '"progress"' in out  # the long poll
        assert '"schema":"sensorium-device-binding.v1"' in out and '"address"' in out  # the binding
        assert '"cancellation":{"state":"requested"' in out or '"status":"cancelled"' in out  # the cancel
    finally:
        assert _stop(first) == 0
    second = _start_run_sh(run_line, data_dir, tmp_path / "second.log")
    try:
        text = _wait(tmp_path / "second.log", second, timeout=120)
    finally:
        _stop(second)
    assert "caller token" not in text and "next steps" in text
    mint = next(line.strip() for line in text.splitlines() if "principals add" in line and "caller" in line)
    minted = _bash(mint.replace("--id NAME", "--id readme-reader"), timeout=30)
    assert minted.returncode == 0, minted.stderr
    assert re.fullmatch(r"[A-Za-z0-9_-]{20,}", minted.stdout.strip().splitlines()[-1])
