"""A pytest plugin for downstream suites: a real connector with simulated or replayed devices, and a client.

Use it from a test suite with `pytest_plugins = ["connector.testing"]`, then ask for `sensorium_connector`:

    def test_my_app_finds_the_strap(sensorium_connector):
        ble = sensorium_connector.sim("ble")
        ble.add_device({"address": "AA:BB:CC:DD:EE:01", "rssi": -60, "name": "Strap",
                        "service_uuids": ["0000180d-0000-1000-8000-00805f9b34fb"]})
        caller = sensorium_connector.caller()
        op = caller.scan("ble", 2, {"service_uuids": ["0000180d-0000-1000-8000-00805f9b34fb"]})
        status = caller.wait_terminal(op)
        assert status["result"]["candidates"]

The fixture runs `sensorium-connector serve --simulate` (all three transports) on 127.0.0.1 with an
OS-chosen port and a fresh data dir, creates a caller and an operator principal, and stops the process
(SIGTERM, confirmed cleanup) after the test. Mark a test with
`@pytest.mark.sensorium_connector(simulate=("ble",), replay={"mdns": "hw-fixtures/mdns-home-network.jsonl"})`
to choose other backends. `start_connector(...)` is the same thing as a context manager.

`client()` hands back the typed async client (`connector.client.ConnectorClient`); `caller()` and
`operator()` a `SyncClient`, a thin synchronous httpx wrapper for suites without an event loop, and
`sim(transport)` the `/v1/sim/...` routes. With `simulate` and no `catalog`, `serve --simulate` serves the
packaged example catalog by itself (CONTRACT §0), so all of this works from the installed wheel alone.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from connector.core.authority import make_grant
from connector.core.lifecycle import TERMINAL_STATUSES
from connector.storage.principals import add_principal

if TYPE_CHECKING:
    from connector.client import ConnectorClient as TypedClient

SCAN_ACTION = "device.discovery.scan"
TERMINAL: frozenset[str] = frozenset(status.value for status in TERMINAL_STATUSES)
_SERVING = re.compile(r"serving on (http://127\.0\.0\.1:\d+)")
_CHECKOUT = Path(__file__).resolve().parents[1]


class SyncClient:
    """Synchronous HTTP calls of one principal against one connector (bearer token in every request)."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 40.0) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout)

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def scan(
        self,
        transport: str,
        window_seconds: int,
        filters: Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
        **input_fields: Any,
    ) -> str:
        """`POST /v1/directives` for one discovery scan; the `connector_operation/id` of the 202 handle."""
        directive: dict[str, Any] = {
            "schema": "sensorium-directive.v1",
            "action_id": SCAN_ACTION,
            "timing": {"mode": "async", "status_versions": [2]},
            "input": {"transport": transport, "window_seconds": window_seconds, "filters": dict(filters)},
        }
        directive["input"].update(input_fields)
        if idempotency_key is not None:
            directive["idempotency_key"] = idempotency_key
        response = self.http.post("/v1/directives", json=directive)
        _expect(response, 202)
        return str(response.json()["connector_operation/id"])

    def status(
        self, operation_id: str, *, wait_seconds: int | None = None, after_revision: int | None = None
    ) -> dict[str, Any]:
        """`GET /v1/operations/{id}`, optionally as a long poll."""
        params: dict[str, int] = {}
        if wait_seconds is not None:
            params["wait_seconds"] = wait_seconds
        if after_revision is not None:
            params["after_revision"] = after_revision
        response = self.http.get(f"/v1/operations/{operation_id}", params=params)
        _expect(response, 200)
        document: dict[str, Any] = response.json()
        return document

    def wait_terminal(self, operation_id: str, *, timeout: float = 90.0) -> dict[str, Any]:
        """Long-poll until the operation is terminal; `TimeoutError` (naming the last status) otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            status = self.status(operation_id, wait_seconds=max(0, min(5, math.floor(left))))
            if status["status"] in TERMINAL:
                return status
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{operation_id} still {status['status']} after {timeout} s")

    def wait_for(
        self, operation_id: str, predicate: Any, *, timeout: float = 30.0, interval: float = 0.1
    ) -> dict[str, Any]:
        """Poll until `predicate(status)` holds; `TimeoutError` (naming the last status) otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status(operation_id)
            if predicate(status):
                return status
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{operation_id}: not met after {timeout} s ({status['status']})")
            time.sleep(interval)

    def cancel(self, operation_id: str) -> dict[str, Any]:
        """`POST /v1/operations/{id}/cancel`: the status after the request."""
        response = self.http.post(f"/v1/operations/{operation_id}/cancel")
        _expect(response, 200)
        document: dict[str, Any] = response.json()
        return document

    def bind(self, operation_id: str, candidate_ref: str, idempotency_key: str) -> httpx.Response:
        """`POST /v1/operations/{id}/bindings` (the raw response: 201 binding, or a refusal)."""
        body = {"candidate/ref": candidate_ref, "idempotency_key": idempotency_key}
        return self.http.post(f"/v1/operations/{operation_id}/bindings", json=body)

    def forget(self, binding_id: str) -> httpx.Response:
        """`DELETE /v1/bindings/{id}`."""
        return self.http.delete(f"/v1/bindings/{binding_id}")


class SimControl:
    """The `/v1/sim/{transport}/...` routes of one simulated transport (operator token)."""

    def __init__(self, http: httpx.Client, transport: str) -> None:
        self._http = http
        self.transport = transport

    def add_device(self, observation: Mapping[str, Any]) -> str:
        """A device appears (or updates, same identity); its `sim/id`."""
        response = self._http.post(f"/v1/sim/{self.transport}/devices", json=dict(observation))
        if response.status_code not in (200, 201):
            raise AssertionError(f"simulated device refused: {response.status_code} {response.text}")
        return str(response.json()["sim/id"])

    def remove_device(self, sim_id: str) -> None:
        """The device leaves."""
        _expect(self._http.delete(f"/v1/sim/{self.transport}/devices/{sim_id}"), 204)

    def adapter(self, **command: Any) -> dict[str, Any]:
        """`{"powered": bool}`, `{"restart": True}` or `{"stop": "ack"|"refuse"|"stall"}`; the new state."""
        response = self._http.post(f"/v1/sim/{self.transport}/adapter", json=command)
        _expect(response, 200)
        state: dict[str, Any] = response.json()
        return state


@dataclass(slots=True)
class MockConnector:
    """A running connector process with its tokens, base URL and log file."""

    process: subprocess.Popen[bytes]
    base_url: str
    caller_token: str
    operator_token: str
    data_dir: Path
    log_path: Path
    _clients: list[SyncClient] = field(default_factory=list)
    _operator_http: httpx.Client | None = None

    def client(self, token: str | None = None) -> TypedClient:
        """The typed async client (`connector.client.ConnectorClient`), as the caller unless told otherwise.

        Use it as `async with sensorium_connector.client() as client: ...`.
        """
        from connector.client import ConnectorClient as Typed

        return Typed(self.base_url, token or self.caller_token, timeout_s=40.0)

    def caller(self) -> SyncClient:
        """A synchronous client with the caller's token (granted every scan transport)."""
        client = SyncClient(self.base_url, self.caller_token)
        self._clients.append(client)
        return client

    def operator(self) -> SyncClient:
        """A synchronous client with the operator's token."""
        client = SyncClient(self.base_url, self.operator_token)
        self._clients.append(client)
        return client

    def sim(self, transport: str) -> SimControl:
        """Control of one simulated transport."""
        if self._operator_http is None:
            headers = {"Authorization": f"Bearer {self.operator_token}"}
            self._operator_http = httpx.Client(base_url=self.base_url, headers=headers, timeout=30.0)
        return SimControl(self._operator_http, transport)

    def logs(self) -> str:
        """Everything the process logged so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait: running scans stop with confirmed cleanup first. The exit code."""
        for client in self._clients:
            client.close()
        if self._operator_http is not None:
            self._operator_http.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(timeout=10)


def default_catalog() -> tuple[Path, Path]:
    """The example catalog and its trust directory (the packaged copies; a checkout's when run from one)."""
    from connector.resources import example_catalog, example_trust

    return example_catalog(), example_trust()


@contextmanager
def start_connector(
    directory: Path | None = None,
    *,
    simulate: Sequence[str] | None = ("ble", "usb-serial", "mdns"),
    replay: Mapping[str, Path | str] | None = None,
    replay_speed: float = 1.0,
    catalog: Path | None = None,
    trust: Path | None = None,
    extra_args: Sequence[str] = (),
    startup_seconds: float = 30.0,
) -> Iterator[MockConnector]:
    """Run `serve` with simulated and/or replayed devices until the block ends."""
    with tempfile.TemporaryDirectory(prefix="sensorium-testing-", dir=directory) as tmp:
        base = Path(tmp)
        data_dir = base / "data"
        caller = add_principal(data_dir, "test-caller", "caller", [make_grant(SCAN_ACTION)])
        operator = add_principal(data_dir, "test-operator", "operator")
        argv = [sys.executable, "-m", "connector", "serve", "--host", "127.0.0.1", "--port", "0"]
        argv += ["--data-dir", str(data_dir), "--mdns-interfaces", "127.0.0.1"]
        if catalog is not None or not simulate:
            default_catalog_path, default_trust = default_catalog()
            argv += ["--catalog", str(catalog or default_catalog_path)]
            argv += ["--trust", str(trust or default_trust)]
            if trust is None:
                argv.append("--allow-test-key")  # the example key: a test harness may trust it (CONTRACT §12)
        if simulate:
            argv += ["--simulate", ",".join(simulate)]
        for transport, path in (replay or {}).items():
            argv += ["--replay", f"{transport}={path}"]
        argv += ["--replay-speed", str(replay_speed), *extra_args]
        log_path = base / "serve.log"
        with log_path.open("wb") as sink:
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, env=_env()
            )
        connector = MockConnector(process, "", caller, operator, data_dir, log_path)
        try:
            connector.base_url = wait_serving(process, log_path, startup_seconds)
            yield connector
        finally:
            connector.stop()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_CHECKOUT), env.get("PYTHONPATH", "")) if p)
    return env


def wait_serving(process: subprocess.Popen[bytes], log_path: Path, seconds: float) -> str:
    """The base URL of a `serve` that logs to `log_path`, once `/healthz` answers 200."""
    deadline = time.monotonic() + seconds
    url = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"serve exited with {process.returncode}; its log:\n{_tail(log_path)}")
        if url is None:
            found = _SERVING.search(log_path.read_text(encoding="utf-8", errors="replace"))
            url = found.group(1) if found else None
        if url is not None:
            try:
                if httpx.get(url + "/healthz", timeout=2.0).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
        time.sleep(0.05)
    raise RuntimeError(f"serve did not become healthy in {seconds} s; its log:\n{_tail(log_path)}")


def _tail(log_path: Path, lines: int = 40) -> str:
    """The last lines of a log, kept in the error (the file itself goes with its temporary directory)."""
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _expect(response: httpx.Response, status_code: int) -> None:
    if response.status_code != status_code:
        raise AssertionError(f"expected {status_code}, got {response.status_code}: {response.text}")


# ---- the pytest plugin -----------------------------------------------------------------------------------

try:
    import pytest
except ImportError:  # pragma: no cover - the module is usable without pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    def pytest_configure(config: Any) -> None:
        """Register the marker that chooses the fixture's backends."""
        config.addinivalue_line(
            "markers",
            "sensorium_connector(simulate=..., replay=..., replay_speed=...): backends of the "
            "sensorium_connector fixture",
        )

    @pytest.fixture
    def sensorium_connector(request: Any, tmp_path: Path) -> Iterator[MockConnector]:
        """A running connector with simulated devices (all transports unless the marker says otherwise)."""
        marker = request.node.get_closest_marker("sensorium_connector")
        options: dict[str, Any] = dict(marker.kwargs) if marker is not None else {}
        with start_connector(tmp_path, **options) as connector:
            try:
                yield connector
            finally:
                # Shown with a failing test's report; the log file goes with the temporary directory.
                log = _tail(connector.log_path)
                request.node.add_report_section("call", "sensorium-connector serve log", log)
