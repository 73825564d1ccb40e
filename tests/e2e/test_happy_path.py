"""The whole discovery path over HTTP: directive -> 202 -> polls -> select -> bind -> forget."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api.support import (
    HEART_RATE_LAB,
    TERMINAL,
    assert_error,
    assert_valid,
    candidates_of,
    harness,
    query,
)
from tests.support.directives import scan_directive


@pytest.mark.asyncio
async def test_directive_to_forget_with_valid_statuses(tmp_path: Path) -> None:
    context = {"operation/id": "parent-op-1", "trace/id": "trace-1"}
    async with harness(tmp_path, replay={"ble": HEART_RATE_LAB}) as h:
        accepted = await h.invoke("alice", scan_directive(2, extra={"causal/context": context}))
        assert accepted.status_code == 202, accepted.text
        handle = accepted.json()
        assert_valid("sensorium-connector-deferred.v1", handle)
        location = accepted.headers["location"]
        assert location == handle["status_path"] == f"/v1/operations/{handle['connector_operation/id']}"
        assert accepted.headers["retry-after"] == str(handle["retry_after_seconds"]) == "1"
        assert handle["cancel_path"] == location + "/cancel"

        running = await h.poll(
            "alice", location, lambda d: d["status"] == "running" and bool(candidates_of(d))
        )
        chosen = candidates_of(running[-1])[0]["candidate/ref"]
        selected = await h.post("alice", location + "/selection", {"candidate/ref": chosen})
        assert selected.status_code == 200 and selected.json()["candidate/ref"] == chosen

        polls = running + await h.poll("alice", location)
        assert_valid("deferred-operation-status.v2", polls)
        assert all(poll["causal/context"] == context for poll in polls)
        final = polls[-1]
        assert final["status"] == "completed"
        assert final["result"]["reason"] == "window-complete"
        assert final["cleanup"] == {"state": "confirmed", "claim": "released"}
        assert chosen in {c["candidate/ref"] for c in final["result"]["candidates"]}

        bound = await h.post(
            "alice", location + "/bindings", {"candidate/ref": chosen, "idempotency_key": "b1"}
        )
        assert bound.status_code == 201, bound.text
        binding = bound.json()
        assert_valid("sensorium-device-binding.v1", binding)
        assert binding["operation/id"] == handle["connector_operation/id"]
        # The address is revealed by the binding only: no status ever carried it.
        assert all(binding["address"] not in str(poll) for poll in polls)
        assert query(h.data_dir, "SELECT binding_id FROM bindings") == [(binding["binding/id"],)]

        forgotten = await h.client.delete(f"/v1/bindings/{binding['binding/id']}", headers=h.auth("alice"))
        assert forgotten.status_code == 204 and forgotten.content == b""
        assert query(h.data_dir, "SELECT binding_id FROM bindings") == []
        again = await h.client.delete(f"/v1/bindings/{binding['binding/id']}", headers=h.auth("alice"))
        assert_error(again, 404, "unknown-binding")
        assert final["status"] in TERMINAL
