"""Lifecycle log lines (text and JSON Lines) and Prometheus metrics of a real `serve --simulate` process.

One structured line per lifecycle event with the operation id, action, transport, status, reason or code and
durations; never candidate data (canaries planted in names, payloads and addresses are grepped for in every
log line and in `/metrics`). Metrics: sessions by transport and outcome, cancellation latency and cleanup
duration histograms, claims held, uncertain cleanups, request latency by route template.
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path

import httpx
import pytest

from connector.telemetry.events import LifecycleEvent, format_text
from tests.support.directives import HEART_RATE

pytestmark = pytest.mark.serve



def _sample(metrics: str, name: str, **labels: str) -> float:
    for line in metrics.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.timeout(120)
def test_json_lines_and_metrics_carry_lifecycle_facts_never_candidates(tmp_path: Path) -> None:
    from connector.testing import start_connector

    name = "CANARYname" + secrets.token_hex(5)
    payload = secrets.token_bytes(8).hex()
    mac = ":".join(f"{b:02X}" for b in secrets.token_bytes(6))
    with start_connector(tmp_path, extra_args=["--log-format", "json"]) as connector:
        ble, usb = connector.sim("ble"), connector.sim("usb-serial")
        ble.add_device(
            {
                "address": mac,
                "rssi": -50,
                "name": name,
                "service_uuids": [HEART_RATE],
                "manufacturer_data": {"65535": payload},
            }
        )
        caller = connector.caller()
        done = caller.scan("ble", 1, {"service_uuids": [HEART_RATE]})
        assert caller.wait_terminal(done)["status"] == "completed"
        cancelled = caller.scan("ble", 30, {"service_uuids": [HEART_RATE]})
        caller.wait_for(
            cancelled, lambda s: bool(s.get("progress", {}).get("snapshot", {}).get("candidates"))
        )
        caller.cancel(cancelled)
        assert caller.wait_terminal(cancelled)["status"] == "cancelled"
        usb.adapter(stop="refuse")
        held = caller.scan("usb-serial", 30, {"vid_pid": [{"vid": 1, "pid": 2}]})
        caller.wait_for(held, lambda s: s["status"] == "running")
        caller.cancel(held)
        assert caller.wait_terminal(held)["cleanup"]["state"] == "uncertain"
        metrics = httpx.get(connector.base_url + "/metrics").text
        usb.adapter(stop="ack")
        caller.wait_for(held, lambda s: s["cleanup"]["state"] == "confirmed", timeout=40)
        after = httpx.get(connector.base_url + "/metrics").text
        logs = connector.logs()

    # metrics
    assert (
        _sample(
            metrics,
            "sensorium_discovery_sessions_total",
            transport="ble",
            status="completed",
            outcome="window-complete",
        )
        == 1
    )
    assert _sample(metrics, "sensorium_discovery_sessions_total", transport="ble", status="cancelled") == 1
    assert (
        _sample(
            metrics,
            "sensorium_discovery_sessions_total",
            transport="usb-serial",
            status="failed",
            outcome="cancellation-unconfirmed",
        )
        == 1
    )
    assert _sample(metrics, "sensorium_cancellation_latency_seconds_count", transport="ble") == 1
    assert (
        _sample(metrics, "sensorium_cleanup_duration_seconds_count", transport="ble", cleanup="confirmed")
        == 2
    )
    assert (
        _sample(
            metrics, "sensorium_cleanup_duration_seconds_count", transport="usb-serial", cleanup="uncertain"
        )
        == 1
    )
    assert _sample(metrics, "sensorium_cleanups_uncertain", transport="usb-serial") == 1
    assert _sample(metrics, "sensorium_claims_held", transport="usb-serial") == 1
    assert _sample(after, "sensorium_cleanups_uncertain", transport="usb-serial") == 0
    assert _sample(after, "sensorium_claims_held", transport="usb-serial") == 0
    assert (
        _sample(
            after,
            "sensorium_cleanup_duration_seconds_count",
            transport="usb-serial",
            cleanup="confirmed-late",
        )
        == 1
    )
    assert (
        _sample(
            metrics,
            "sensorium_http_request_duration_seconds_count",
            method="POST",
            route="/v1/directives",
            status="202",
        )
        == 3
    )
    assert (
        _sample(
            metrics,
            "sensorium_http_request_duration_seconds_count",
            method="GET",
            route="/v1/operations/{operation_id}",
            status="200",
        )
        >= 3
    )
    assert "deferred:" not in metrics, "no operation id becomes a label"

    # logs: every line is JSON; one lifecycle line per event
    lines = [json.loads(line) for line in logs.splitlines() if line.strip()]
    events = [line for line in lines if line.get("logger") == "sensorium.lifecycle"]
    by_op: dict[str, list[str]] = {}
    for event in events:
        by_op.setdefault(event["op"], []).append(event["event"])
    assert by_op[done] == ["admitted", "running", "ended"]
    assert by_op[cancelled] == ["admitted", "running", "cancel-requested", "ended"]
    assert by_op[held] == ["admitted", "running", "cancel-requested", "ended", "cleanup-confirmed"]
    ended = next(e for e in events if e["op"] == done and e["event"] == "ended")
    assert ended["action"] == "device.discovery.scan" and ended["transport"] == "ble"
    assert ended["status"] == "completed" and ended["code"] == "window-complete"
    assert ended["cleanup"] == "confirmed" and ended["claim"] == "released"
    assert ended["duration_ms"] >= 1000 and "cleanup_ms" in ended and ended["adapter"] == "default"
    stopped = next(e for e in events if e["op"] == cancelled and e["event"] == "ended")
    assert stopped["status"] == "cancelled" and stopped["cancel_latency_ms"] >= 0
    uncertain = next(e for e in events if e["op"] == held and e["event"] == "ended")
    assert uncertain["code"] == "cancellation-unconfirmed" and uncertain["claim"] == "held"
    for canary in (name, payload, mac, mac.lower(), payload.upper()):
        assert canary not in logs and canary not in metrics and canary not in after


def test_the_text_line_is_key_value_and_drops_unsafe_words() -> None:
    event = LifecycleEvent(
        event="ended",
        operation_id="deferred:sensorium.directive.invoke:" + "A" * 26,
        action_id="device.discovery.scan",
        kind="discovery",
        status="failed",
        transport="ble",
        adapter="hci0 name with spaces",
        code="provider-restarted",
        duration_ms=1500,
    )
    text = format_text(event.fields())
    assert text == (
        "event=ended op=deferred:sensorium.directive.invoke:" + "A" * 26 + " action=device.discovery.scan "
        "kind=discovery transport=ble status=failed code=provider-restarted duration_ms=1500"
    )
    odd = LifecycleEvent(
        event="ended", operation_id="not an id", action_id="x y", kind="discovery", status="?"
    )
    assert odd.fields() == {"event": "ended", "op": "-", "action": "-", "kind": "discovery"}
