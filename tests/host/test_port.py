"""The host's port asks the connector service's own methods: observe, poll (delivered), cancel, stop."""

from __future__ import annotations

from pathlib import Path

import pytest

from connector.core.ids import OPERATION_KIND, random_operation_id
from connector.host.port import InProcessConnector
from tests.api.support import RecordingFactory, candidates_of, harness, straps
from tests.runtime.sessions import metadata_of, waited
from tests.support.directives import scan_directive

pytestmark = pytest.mark.asyncio


async def test_a_poll_through_the_port_is_delivered_and_a_cancel_says_what_it_changed(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(2))) as h:
        accepted = await h.invoke("alice", scan_directive(30))
        op_id = accepted.json()["connector_operation/id"]
        port = InProcessConnector(h.assembled.service)
        await waited(h.assembled.discovery, op_id, 0, 10.0)  # the first revision (a read: nothing disclosed)
        assert metadata_of(h.assembled.discovery, op_id)["disclosed_count"] == 0
        status = await port.caller_status(op_id, "discovery", wait_seconds=None, after_revision=None)
        assert status is not None and len(candidates_of(status)) == 2
        assert metadata_of(h.assembled.discovery, op_id)["disclosed_count"] == 2, "what the host got counts"
        first = await h.assembled.service.request_cancel(op_id, "discovery")
        again = await h.assembled.service.request_cancel(op_id, "discovery")
        assert first is not None and first[0] is True and first[1]["cancellation"]["state"] == "requested"
        assert again is not None and again[0] is False, "a repeated cancel changes nothing"
        observed = await port.observe(op_id, "discovery")
        assert observed is not None and observed.status in ("running", "cancelled")
        assert "strap" not in str(observed.metadata) and "candidate/ref" not in str(observed.metadata)


async def test_an_id_the_connector_does_not_hold_is_none_for_every_question(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        port = InProcessConnector(h.assembled.service)
        never = random_operation_id(OPERATION_KIND, bytes(16))
        for kind in ("discovery", "command"):
            assert await port.observe(never, kind) is None
            assert await port.caller_status(never, kind, wait_seconds=30, after_revision=None) is None
            assert await port.cancel(never, kind) is None
            await port.stop(never, kind, "deadline-exceeded")
