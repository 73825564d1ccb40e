"""`connector.testing` as a downstream suite uses it: `pytest_plugins = ["connector.testing"]` in conftest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.serve

CONFTEST = 'pytest_plugins = ["connector.testing"]\n'
DOWNSTREAM = '''
import pytest
from tests.support.directives import HEART_RATE



def test_a_simulated_strap_is_found(sensorium_connector):
    sensorium_connector.sim("ble").add_device(
        {"address": "AA:BB:CC:DD:EE:01", "rssi": -60, "name": "Strap", "service_uuids": [HEART_RATE]}
    )
    caller = sensorium_connector.caller()
    status = caller.wait_terminal(caller.scan("ble", 1, {"service_uuids": [HEART_RATE]}))
    assert status["status"] == "completed"
    assert [c["label"] for c in status["result"]["candidates"]] == ["Strap"]


@pytest.mark.anyio
async def test_the_typed_client_watches_a_simulated_scan(sensorium_connector):
    sensorium_connector.sim("mdns").add_device(
        {"service_type": "_ipp._tcp.local.", "name": "Lab._ipp._tcp.local.", "port": 631}
    )
    directive = {
        "schema": "sensorium-directive.v1",
        "action_id": "device.discovery.scan",
        "timing": {"mode": "async", "status_versions": [2]},
        "input": {"transport": "mdns", "window_seconds": 1, "filters": {"service_types": ["_ipp._tcp"]}},
    }
    async with sensorium_connector.client() as client:
        handle = await client.start(directive)
        statuses = [status async for status in client.watch(handle)]
    assert statuses[-1].status == "completed"


@pytest.mark.sensorium_connector(simulate=None, replay={"mdns": "REPLAY"}, replay_speed=10.0)
def test_replayed_devices(sensorium_connector):
    caller = sensorium_connector.caller()
    status = caller.wait_terminal(caller.scan("mdns", 2, {"service_types": ["_googlecast._tcp"]}))
    assert status["status"] == "completed" and status["result"]["candidates"]
    off = sensorium_connector.operator().http.post("/v1/sim/ble/adapter", json={"powered": False})
    assert off.status_code == 404
'''


@pytest.mark.timeout(120)
def test_a_downstream_suite_gets_a_connector_and_a_client(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST, encoding="utf-8")
    replay = REPO / "hw-fixtures" / "mdns-home-network.jsonl"
    (tmp_path / "test_downstream.py").write_text(DOWNSTREAM.replace("REPLAY", str(replay)), encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=110,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout
