"""The host's cancel of a visible row: the runtime's own `changed` answers whether it changed anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from connector.service.answers import Accepted
from tests.host.fakes import TOKENS, fake_host
from tests.host.fakes import directive as make_directive

pytestmark = pytest.mark.asyncio


async def test_a_cancel_reports_what_the_connector_said_it_changed(tmp_path: Path) -> None:
    host, port, _ = await fake_host(tmp_path)
    try:
        answer = await host.admit(host.authenticate(TOKENS["alice"]), make_directive())
        assert isinstance(answer, Accepted)
        op_id = answer.handle["operation/id"]
        port.ops[op_id].status = "running"
        record = await host.registry.get(op_id)
        assert record is not None
        first = await host.cancel_visible(record)
        assert first.changed is True and port.cancels == [op_id]
        port.ops[op_id].status = "cancelled"  # the fake answers False for work no longer live
        late = await host.cancel_visible(record)
        assert late.changed is False and late.answer.document["status"] == "cancelled"
        ended = await host.registry.get(op_id)
        assert ended is not None and ended.terminal
        again = await host.cancel_visible(ended)
        assert again.changed is False and port.cancels == [op_id, op_id], "a terminal row asks no cancel"
    finally:
        await host.registry.aclose()


async def test_a_cancel_the_connector_does_not_know_concludes_unknown(tmp_path: Path) -> None:
    host, port, _ = await fake_host(tmp_path)
    try:
        answer = await host.admit(host.authenticate(TOKENS["alice"]), make_directive())
        assert isinstance(answer, Accepted)
        op_id = answer.handle["operation/id"]
        record = await host.registry.get(op_id)
        assert record is not None
        del port.ops[op_id]
        cancelled = await host.cancel_visible(record)
        assert cancelled.changed is False and cancelled.answer.document["status"] == "unknown"
    finally:
        await host.registry.aclose()
