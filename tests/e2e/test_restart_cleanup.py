"""After a restart the console shows the cleanup a restart proves, not the last poll's `pending, claim held`.

Whether the old process stopped gracefully (SIGTERM: its sessions stopped with confirmed cleanup) or was
killed (kill -9), the next start marks the open operation interrupted with cleanup confirmed and the claim
released: every claim of the old process ended with it (CONTRACT §6.7), which is what the adapters page shows.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.api.console.conftest import BleCanaries, ble_fixture
from tests.e2e.serve_process import add_test_principals, replay_serving, start_host_scan, wait_host_status
from tests.support.directives import scan_directive

pytestmark = pytest.mark.serve


def _admin_view(server: object, token: str, op_id: str) -> dict[str, object]:
    with server.client(token) as operator:  # type: ignore[attr-defined]
        response = operator.get(f"/v1/admin/deferred-operations/{op_id}")
        assert response.status_code == 200
        operation: dict[str, object] = response.json()["operation"]
        return operation


PENDING = {"state": "pending", "claim": "held"}


def _recorded_running(server: object, token: str, op_id: str, timeout: float = 20.0) -> dict[str, object]:
    """The admin view once the poller recorded the scan `running` with its cleanup pending (or at timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        view = _admin_view(server, token, op_id)
        metadata = view["metadata"]
        pending = isinstance(metadata, dict) and metadata.get("cleanup") == PENDING
        if (view["status"] == "running" and pending) or time.monotonic() > deadline:
            return view
        time.sleep(0.1)  # real peer: the serve process's poller


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_an_interrupted_scan_reports_its_observed_cleanup(tmp_path: Path, how: str) -> None:
    data_dir = tmp_path / "data"
    tokens = add_test_principals(data_dir)
    fixture = ble_fixture(tmp_path / "ble.jsonl", BleCanaries.fresh())
    with replay_serving(data_dir, tmp_path / "logs", name="before", replays={"ble": fixture}) as server:
        with server.client(tokens.caller) as caller:
            op_id = start_host_scan(caller, scan_directive(60))
            assert wait_host_status(caller, op_id, ["running"])["status"] == "running"
        recorded = _recorded_running(server, tokens.operator, op_id)
        metadata = recorded["metadata"]
        assert recorded["status"] == "running" and isinstance(metadata, dict)
        assert metadata.get("cleanup") == PENDING
        if how == "kill9":
            server.kill9()
        else:
            assert server.stop() == 0
    with replay_serving(data_dir, tmp_path / "logs", name="after", replays={"ble": fixture}) as server:
        view = _admin_view(server, tokens.operator, op_id)
        metadata = view["metadata"]
        assert isinstance(metadata, dict)
        assert view["status"] == "failed" and metadata["error_code"] == "interrupted-by-restart"
        assert metadata["cleanup"] == {"state": "confirmed", "claim": "released"}
