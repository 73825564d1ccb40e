"""A real `sensorium-connector serve` process for end-to-end tests: port 0, logs captured to files."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from connector.core.authority import make_grant
from connector.storage.principals import add_principal

REPO = Path(__file__).resolve().parents[2]
SCAN_ACTION = "device.discovery.scan"
_SERVING = re.compile(r"serving on (http://127\.0\.0\.1:\d+)")


def serve_env() -> dict[str, str]:
    """The test interpreter's environment with the repository importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("FORCE_COLOR", None)
    return env


@dataclass(frozen=True, slots=True)
class Tokens:
    """Bearer tokens of the test principals (never written anywhere by the tests)."""

    caller: str
    operator: str


def add_test_principals(data_dir: Path) -> Tokens:
    """A caller allowed to scan every transport and an operator."""
    caller = add_principal(data_dir, "caller-1", "caller", [make_grant(SCAN_ACTION)])
    operator = add_principal(data_dir, "operator-1", "operator")
    return Tokens(caller=caller, operator=operator)


@dataclass(slots=True)
class ServeProcess:
    """One running `serve` with its base URL and log files."""

    process: subprocess.Popen[bytes]
    base_url: str
    stdout_path: Path
    stderr_path: Path

    def client(self, token: str | None = None, timeout: float = 10.0) -> httpx.Client:
        """An HTTP client for this server, optionally with a bearer token."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def kill9(self) -> None:
        """SIGKILL: no shutdown code of the server runs."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait for the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
            raise


def _wait_for_url(process: subprocess.Popen[bytes], stderr_path: Path, deadline: float) -> str:
    """The base URL from the `serving on` log line."""
    while time.monotonic() < deadline:
        found = _SERVING.search(stderr_path.read_text(errors="replace"))
        if found:
            return found.group(1)
        if process.poll() is not None:
            raise AssertionError(f"serve exited with {process.returncode} before serving")
        time.sleep(0.05)
    raise AssertionError("serve did not log its URL in time")


def _wait_healthy(base_url: str, deadline: float) -> None:
    with httpx.Client(base_url=base_url, timeout=2.0) as client:
        while time.monotonic() < deadline:
            if client.get("/healthz").status_code == 200:
                return
            time.sleep(0.05)
    raise AssertionError("serve did not become healthy in time")


def start_serve(
    data_dir: Path,
    log_dir: Path,
    *,
    name: str,
    replays: Mapping[str, Path],
    replay_speed: float = 1.0,
    startup_seconds: float = 30.0,
) -> ServeProcess:
    """Start `serve --port 0` with replay fixtures; returns once `/healthz` answers 200."""
    args = [sys.executable, "-m", "connector", "serve", "--data-dir", str(data_dir), "--port", "0"]
    args += ["--catalog", str(REPO / "catalog/actions.json"), "--trust", str(REPO / "catalog/trust")]
    for transport, fixture in replays.items():
        args += ["--replay", f"{transport}={fixture}"]
    args += ["--replay-speed", str(replay_speed), "--mdns-interfaces", "127.0.0.1"]
    log_dir.mkdir(parents=True, exist_ok=True)
    stdout_path, stderr_path = log_dir / f"{name}.stdout.log", log_dir / f"{name}.stderr.log"
    with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
        process = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=err, env=serve_env())
    deadline = time.monotonic() + startup_seconds
    try:
        base_url = _wait_for_url(process, stderr_path, deadline)
        _wait_healthy(base_url, deadline)
    except BaseException:
        process.kill()
        process.wait(timeout=10)
        raise
    return ServeProcess(process, base_url, stdout_path, stderr_path)


@contextmanager
def serving(data_dir: Path, log_dir: Path, **kwargs: Any) -> Iterator[ServeProcess]:
    """`start_serve` that always ends the process (SIGTERM, else SIGKILL)."""
    server = start_serve(data_dir, log_dir, **kwargs)
    try:
        yield server
    finally:
        if server.process.poll() is None:
            server.stop()


def scan_directive(
    transport: str, window_seconds: int, filters: Mapping[str, Any], **extra: Any
) -> dict[str, Any]:
    """A `sensorium-directive.v1` for one discovery scan."""
    return {
        "schema": "sensorium-directive.v1",
        "action_id": SCAN_ACTION,
        "timing": {"mode": "async", "status_versions": [2]},
        "input": {"transport": transport, "window_seconds": window_seconds, "filters": dict(filters)},
        **extra,
    }


def start_host_scan(client: httpx.Client, directive: Mapping[str, Any]) -> str:
    """`POST /v1/host/directives`; returns the operation id of the 202 handle."""
    response = client.post("/v1/host/directives", json=dict(directive))
    assert response.status_code == 202, response.status_code
    handle = response.json()
    assert handle["status"] == "deferred"
    assert response.headers["location"] == handle["status_href"]
    return str(handle["operation/id"])


def host_status(client: httpx.Client, op_id: str) -> dict[str, Any]:
    """`GET /v1/host/operations/{id}` as the owning caller."""
    response = client.get(f"/v1/host/operations/{op_id}")
    assert response.status_code == 200, response.status_code
    document: dict[str, Any] = response.json()
    return document


def wait_host_status(
    client: httpx.Client,
    op_id: str,
    until: Sequence[str],
    *,
    timeout: float = 30.0,
    interval: float = 0.2,
) -> dict[str, Any]:
    """Poll the host status route until the status is one of `until`."""
    deadline = time.monotonic() + timeout
    while True:
        document = host_status(client, op_id)
        if document["status"] in until or time.monotonic() > deadline:
            return document
        time.sleep(interval)


def write_fixture(path: Path, transport: str, lines: Sequence[Mapping[str, Any]]) -> Path:
    """A synthesised `sensorium-hw-fixture.v1` JSON Lines file."""
    header = {
        "fixture": "sensorium-hw-fixture.v1",
        "transport": transport,
        "source": "synthesised",
        "recorded_at": "2026-11-30T09:00:00Z",
        "adapter": "hci0" if transport == "ble" else None,
        "versions": {"generator": "tests", "format": 1},
        "notes": "Synthesised by a test.",
    }
    if header["adapter"] is None:
        del header["adapter"]
    text = "\n".join(json.dumps(line, separators=(",", ":")) for line in (header, *lines))
    path.write_text(text + "\n", encoding="utf-8")
    return path
