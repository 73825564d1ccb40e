"""`serve --simulate` (CONTRACT §13.1) end to end: a real serve process driven through `connector.testing`.

Every CONTRACT §6 rule is checked on simulated sessions as on real ones: devices appear, update and leave
while a scan runs; a powered-off adapter refuses to start; power loss and a backend restart end sessions
`provider-restarted`; a refused or stalled stop leaves cleanup uncertain and the claim held (409
`transport-claimed`) until a later `{"stop": "ack"}`.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from connector.testing import MockConnector, start_connector
from tests.support.directives import HEART_RATE
from tests.support.paths import HW_FIXTURES

pytestmark = pytest.mark.serve

BLE_FILTER = {"service_uuids": [HEART_RATE]}


@pytest.fixture(scope="module")
def connector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MockConnector]:
    with start_connector(tmp_path_factory.mktemp("sim")) as running:
        yield running


def _strap(name: str, **extra: Any) -> dict[str, Any]:
    mac = ":".join(f"{b:02X}" for b in secrets.token_bytes(6))
    return {"address": mac, "rssi": -60, "name": name, "service_uuids": [HEART_RATE], **extra}


def _candidates(status: dict[str, Any]) -> list[dict[str, Any]]:
    if "result" in status:
        return list(status["result"]["candidates"])
    return list(status.get("progress", {}).get("snapshot", {}).get("candidates", []))


def test_routes_need_an_operator_and_refuse_bad_bodies_without_echo(connector: MockConnector) -> None:
    url = connector.base_url + "/v1/sim/ble/devices"
    assert httpx.post(url, json=_strap("x")).status_code == 401
    caller = httpx.post(url, json=_strap("x"), headers={"Authorization": f"Bearer {connector.caller_token}"})
    assert caller.status_code == 403 and caller.json()["code"] == "forbidden"
    operator = {"Authorization": f"Bearer {connector.operator_token}"}
    unknown = httpx.post(connector.base_url + "/v1/sim/zigbee/devices", json={}, headers=operator)
    assert unknown.status_code == 404 and unknown.json()["code"] == "not-found"
    secret = "CANARYsim" + secrets.token_hex(6)
    bad = httpx.post(url, json={"address": secret, "rssi": "loud"}, headers=operator)
    assert bad.status_code == 422 and bad.json()["code"] == "invalid-input"
    assert secret not in bad.text and "/rssi" in bad.text
    gone = httpx.delete(connector.base_url + "/v1/sim/ble/devices/sim-nope", headers=operator)
    assert gone.status_code == 404 and gone.json()["code"] == "not-found"
    odd = httpx.post(connector.base_url + "/v1/sim/ble/adapter", json={"stop": "maybe"}, headers=operator)
    assert odd.status_code == 422


def test_a_ble_device_appears_updates_and_is_delivered(connector: MockConnector) -> None:
    ble = connector.sim("ble")
    caller = connector.caller()
    op = caller.scan("ble", 3, BLE_FILTER)
    running = caller.wait_for(op, lambda s: s["status"] == "running")
    assert running["status"] == "running" and not _candidates(running)
    device = _strap("Strap-A", interval_ms=200)
    sim_id = ble.add_device(device)
    seen = caller.wait_for(op, lambda s: len(_candidates(s)) == 1, timeout=10)
    assert _candidates(seen)[0]["label"] == "Strap-A"
    assert ble.add_device({**device, "name": "Strap-B", "rssi": -40}) == sim_id  # same identity: update
    updated = caller.wait_for(op, lambda s: _candidates(s) and _candidates(s)[0].get("label") == "Strap-B")
    assert _candidates(updated)[0]["signal"]["rssi_dbm"] == -40
    other = ble.add_device(_strap("Other", service_uuids=["0000180f-0000-1000-8000-00805f9b34fb"]))
    final = caller.wait_terminal(op)
    assert final["status"] == "completed" and final["cleanup"] == {"state": "confirmed", "claim": "released"}
    assert [c["label"] for c in final["result"]["candidates"]] == ["Strap-B"]  # re-filtered: no "Other"
    ble.remove_device(sim_id)
    ble.remove_device(other)


def test_usb_and_mdns_devices_leave_during_the_scan(connector: MockConnector) -> None:
    usb, mdns = connector.sim("usb-serial"), connector.sim("mdns")
    caller = connector.caller()
    port = usb.add_device({"device": "/dev/ttyUSB7", "vid": 0x2341, "pid": 0x0043, "product": "Uno"})
    printer = mdns.add_device(
        {"service_type": "_ipp._tcp.local.", "name": "Lab._ipp._tcp.local.", "port": 631, "ttl": 120}
    )
    usb_op = caller.scan("usb-serial", 4, {"vid_pid": [{"vid": 0x2341, "pid": 0x0043}]})
    mdns_op = caller.scan("mdns", 4, {"service_types": ["_ipp._tcp"]})
    assert _candidates(caller.wait_for(usb_op, lambda s: len(_candidates(s)) == 1))[0]["usb"]["vid"] == 0x2341
    assert _candidates(caller.wait_for(mdns_op, lambda s: len(_candidates(s)) == 1))[0]["label"] == "Lab"
    usb.remove_device(port)
    mdns.remove_device(printer)
    assert caller.wait_for(usb_op, lambda s: not _candidates(s))["status"] in ("running", "completed")
    assert caller.wait_for(mdns_op, lambda s: not _candidates(s))["status"] in ("running", "completed")
    for op in (usb_op, mdns_op):
        final = caller.wait_terminal(op)
        assert final["status"] == "completed" and final["result"]["candidates"] == []


def test_power_and_restart_faults(connector: MockConnector) -> None:
    ble = connector.sim("ble")
    caller = connector.caller()
    assert ble.adapter(powered=False)["powered"] is False
    refused = caller.wait_terminal(caller.scan("ble", 2, BLE_FILTER))
    assert refused["status"] == "failed" and refused["error"]["code"] == "provider-unavailable"
    ble.adapter(powered=True)
    sim_id = ble.add_device(_strap("Lost"))
    op = caller.scan("ble", 20, BLE_FILTER)
    caller.wait_for(op, lambda s: bool(_candidates(s)))
    ble.adapter(powered=False)
    lost = caller.wait_terminal(op)
    assert lost["status"] == "failed" and lost["error"]["code"] == "provider-restarted"
    assert lost["cleanup"] == {"state": "confirmed", "claim": "released"} and "progress" not in lost
    ble.adapter(powered=True)
    op = caller.scan("ble", 20, BLE_FILTER)
    caller.wait_for(op, lambda s: s["status"] == "running")
    ble.adapter(restart=True)
    restarted = caller.wait_terminal(op)
    assert restarted["status"] == "failed" and restarted["error"]["code"] == "provider-restarted"
    ble.remove_device(sim_id)


@pytest.mark.parametrize("mode", ["refuse", "stall"])
def test_an_unacknowledged_stop_holds_the_claim_until_a_later_ack(
    connector: MockConnector, mode: str
) -> None:
    ble = connector.sim("ble")
    caller = connector.caller()
    op = caller.scan("ble", 30, BLE_FILTER)
    caller.wait_for(op, lambda s: s["status"] == "running")
    assert ble.adapter(stop=mode)["stop"] == mode
    caller.cancel(op)
    ended = caller.wait_terminal(op)
    assert ended["status"] == "failed" and ended["error"]["code"] == "cancellation-unconfirmed"
    assert ended["cancellation"]["state"] == "uncertain"
    assert ended["cleanup"] == {"state": "uncertain", "claim": "held"}
    assert not any(d["code"] == "stop-by-disconnect" for d in ended["diagnostics"])  # no qualified proof
    blocked = caller.http.post(
        "/v1/directives",
        json={
            "schema": "sensorium-directive.v1",
            "action_id": "device.discovery.scan",
            "timing": {"mode": "async", "status_versions": [2]},
            "input": {"transport": "ble", "window_seconds": 1, "filters": BLE_FILTER},
        },
    )
    assert blocked.status_code == 409 and blocked.json()["code"] == "transport-claimed"
    assert "retry-after" in blocked.headers
    ble.adapter(stop="ack")
    released = caller.wait_for(op, lambda s: s["cleanup"]["claim"] == "released", timeout=40)
    assert released["cleanup"] == {"state": "confirmed", "claim": "released"}
    assert released["status"] == "failed"  # a terminal status never changes
    assert caller.wait_terminal(caller.scan("ble", 1, BLE_FILTER))["status"] == "completed"


def test_simulation_routes_are_not_found_without_simulate(tmp_path: Path) -> None:
    from connector.testing import start_connector as start

    replay = HW_FIXTURES / "ble-heart-rate-lab.jsonl"
    with start(tmp_path, simulate=None, replay={"ble": replay}) as plain:
        headers = {"Authorization": f"Bearer {plain.operator_token}"}
        for method, path in (("POST", "/v1/sim/ble/devices"), ("POST", "/v1/sim/ble/adapter")):
            answer = httpx.request(method, plain.base_url + path, json={}, headers=headers)
            assert answer.status_code == 404 and answer.json()["code"] == "not-found"
