"""A real `sensorium-connector serve` process for end-to-end tests: port 0, logs captured to files."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.support.directives import SCAN
from tests.support.paths import SHIPPED_CATALOG, SHIPPED_TRUST
from tests.support.principals import Tokens, create_principals
from tests.support.serving import ServeProcess, start_serve


def add_test_principals(data_dir: Path) -> Tokens:
    """`caller-1`, allowed to scan every transport, and the operator `operator-1`: as `caller`, `operator`."""
    made = create_principals(data_dir, {"caller-1": [SCAN]}, ["operator-1"])
    return Tokens(caller=made["caller-1"], operator=made["operator-1"])


def start_replay_serve(
    data_dir: Path,
    log_dir: Path,
    *,
    name: str,
    replays: Mapping[str, Path],
    replay_speed: float = 1.0,
    startup_seconds: float = 30.0,
) -> ServeProcess:
    """`serve` over the shipped catalog with replay fixtures; returns once `/healthz` answers 200."""
    args: list[str | Path] = ["--data-dir", data_dir, "--catalog", SHIPPED_CATALOG, "--trust", SHIPPED_TRUST]
    for transport, fixture in replays.items():
        args += ["--replay", f"{transport}={fixture}"]
    args += ["--replay-speed", str(replay_speed), "--mdns-interfaces", "127.0.0.1"]
    log, stdout = log_dir / f"{name}.stderr.log", log_dir / f"{name}.stdout.log"
    return start_serve(*args, log=log, stdout=stdout, timeout=startup_seconds)


@contextmanager
def replay_serving(data_dir: Path, log_dir: Path, **kwargs: Any) -> Iterator[ServeProcess]:
    """`start_replay_serve` that always ends the process (SIGTERM, else SIGKILL)."""
    server = start_replay_serve(data_dir, log_dir, **kwargs)
    try:
        yield server
    finally:
        if server.process.poll() is None:
            server.stop()


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
        time.sleep(interval)  # real peer: the serve process
