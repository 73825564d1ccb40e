"""CONTRACT §7 and 10 on the Bus: no candidate data in any message, replies and announcements included.

Canary strings live in the replayed device data of every transport (BLE names, manufacturer data and
address, USB product, maker and serial, mDNS instance, TXT and server) and in one scope filter value (a BLE
name prefix). A `>` subscriber records everything the broker carries while scans run, end, get cancelled,
and are read back with `op.get`. The caller-private status (in-process, the HTTP path) must show the canary
devices - the data was there - and no Bus message may hold a canary, its hashes or its base64; the filter
value may appear only in the caller's own `op.start` request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.bus.broker import NatsServer
from tests.bus.support import (
    HTTP,
    TEST_PID,
    TEST_VID,
    client,
    make_env,
    needles,
    running_connector,
    spying,
    watch_states,
)
from tests.support.directives import HEART_RATE, scan_directive
from tests.support.waiting import wait_until


def _labels(status: dict[str, Any]) -> list[str]:
    found = status.get("result", {}).get("candidates") or status.get("progress", {}).get("snapshot", {}).get(
        "candidates", []
    )
    return [candidate.get("label", "") for candidate in found]


def _leaks(blobs: dict[str, bytes], patterns: dict[str, bytes]) -> dict[str, list[str]]:
    found = {}
    for name, blob in blobs.items():
        hits = [pattern_name for pattern_name, pattern in patterns.items() if pattern in blob]
        if hits:
            found[name] = hits
    return found


@pytest.mark.asyncio
async def test_no_canary_reaches_any_bus_message(tmp_path: Path, broker: NatsServer) -> None:
    env = make_env(tmp_path)
    c = env.canaries
    token = env.tokens["alice"]
    directives = {
        "ble": scan_directive(2, filters={"service_uuids": [HEART_RATE], "name_prefix": c.ble_name_prefix}),
        "usb-serial": scan_directive(
            2, transport="usb-serial", filters={"vid_pid": [{"vid": TEST_VID, "pid": TEST_PID}]}
        ),
        "mdns": scan_directive(2, transport="mdns", filters={"service_types": [HTTP]}),
    }
    labels: dict[str, list[str]] = {}
    async with (
        spying(broker.url) as spy,
        running_connector(env, broker.url) as assembled,
        client(broker.url, token) as bus,
    ):
        for transport, directive in directives.items():
            await bus.start(directive, op=f"priv-{transport}")
        for transport in directives:
            record = await assembled.registry.find_by_bus_op("alice", f"priv-{transport}")
            assert record is not None
            with anyio.fail_after(10):
                while not labels.get(transport):
                    answer = await assembled.service.status(
                        assembled.service.authenticate(token), record.operation_id
                    )
                    labels[transport] = _labels(dict(answer.document))
                    await anyio.sleep(0.1)  # real peer: the replayed scan reveals its canary
        for transport in directives:
            op = f"priv-{transport}"
            assert (await watch_states(bus, op, poll_interval=0.3))[-1] == "done"
            assert (await bus.get(op))["disclosed_count"] == 1
            assert (await bus.cancel(op))["cancelled"] is False
        # A cancelled scan of the same canary device, read back afterwards.
        await bus.start(scan_directive(30), op="priv-cancel")
        await anyio.sleep(0.6)  # real peer: the scan starts on the wall clock before it is cancelled
        assert (await bus.cancel("priv-cancel"))["cancelled"] is True
        assert (await watch_states(bus, "priv-cancel", poll_interval=0.3))[-1] == "cancelled"
        await bus.get("priv-cancel")
        ops = [*(f"priv-{t}" for t in directives), "priv-cancel"]
        await wait_until(lambda: all(spy.done(op) for op in ops))
        await anyio.sleep(0.3)  # real peer: a second op.done would have reached the spy by now

    # The data was there: the authorised caller saw the canary devices, over the private path only.
    assert labels == {"ble": [c.ble_name], "usb-serial": [c.usb_product], "mdns": [c.mdns_instance]}
    assert len(spy.messages) > 20 and all(len(spy.done(op)) == 1 for op in ops)
    assert _leaks(spy.blobs(), needles(c.device_values())) == {}
    prefix = needles({"ble_name_prefix": c.ble_name_prefix})
    starts = [m for m in spy.messages if m.subject == "sensorium-os.op.start"]
    assert any(c.ble_name_prefix.encode() in m.data for m in starts)  # the caller's own request only
    assert _leaks(spy.blobs(skip_subjects=["sensorium-os.op.start"]), prefix) == {}
