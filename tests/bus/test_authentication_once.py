"""Each Bus request authenticates once (CONTRACT §8), and op.start checks the directive once."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from connector.assembly import Assembled
from connector.bus.client import BusRefused
from connector.bus.node import NodeSubjects
from connector.contract.validate import validate
from connector.core import admission, authority
from tests.bus.broker import NatsServer
from tests.bus.support import ble_scan, client, make_env, running_connector
from tests.support.directives import command_directive

pytestmark = pytest.mark.asyncio
T = TypeVar("T")
SERVICE = "sensorium-os"
NODE = "n1"
PREFIX = f"{SERVICE}.{NODE}"


async def _once(assembled: Assembled, call: Awaitable[T]) -> T:
    """The answer of one request, which checked exactly one bearer token."""
    before = assembled.service.authentications
    answer = await call
    assert assembled.service.authentications - before == 1
    return answer


async def _operator_request(bus: Any, subject: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
    """A raw operator request (`admin.*` has no client method) with its bearer token."""
    headers = {"Authorization": f"Bearer {token}"}
    msg = await bus.nc.request(subject, json.dumps(body).encode(), timeout=5, headers=headers)
    answer: dict[str, Any] = json.loads(msg.data)
    return answer


async def test_start_get_cancel_and_the_admin_subjects_authenticate_once(
    tmp_path: Path, broker: NatsServer
) -> None:
    env = make_env(tmp_path)
    node = NodeSubjects.of(SERVICE, NODE)
    async with (
        running_connector(env, broker.url, nats_node=NODE) as assembled,
        client(broker.url, env.tokens["alice"], service=PREFIX) as bus,
    ):
        started = await _once(assembled, bus.start(ble_scan(30), op="once-1"))
        assert started["op"] == "once-1" and started["state"] in ("pending", "running")
        joined = await _once(assembled, bus.start(ble_scan(30), op="once-1"))  # a keyed retry joins
        assert joined["op"] == "once-1"
        op_id = (await _once(assembled, bus.get("once-1")))["operation/id"]
        assert (await _once(assembled, bus.cancel("once-1")))["cancelled"] is True
        ops = env.tokens["ops"]
        listing = await _once(assembled, _operator_request(bus, node.admin_list, ops, {}))
        assert op_id in [row["operation/id"] for row in listing["operations"]]
        detail = await _once(
            assembled, _operator_request(bus, node.admin_cancel, ops, {"operation/id": op_id})
        )
        assert detail["operation"]["operation/id"] == op_id


async def test_a_refused_token_is_one_authentication_too(tmp_path: Path, broker: NatsServer) -> None:
    env = make_env(tmp_path)
    async with (
        running_connector(env, broker.url) as assembled,
        client(broker.url, "not-a-token") as bus,
    ):
        for call in (bus.start(ble_scan(30), op="x"), bus.get("x"), bus.cancel("x")):
            before = assembled.service.authentications
            with pytest.raises(BusRefused) as refused:
                await call
            assert refused.value.code == "unauthenticated"
            assert assembled.service.authentications - before == 1


async def test_start_checks_the_directive_once(
    tmp_path: Path, broker: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks: Counter[str] = Counter()
    real = validate

    def counted(schema: str, document: Any, **options: Any) -> Any:
        checks[schema] += 1
        return real(schema, document, **options)

    # Every check of a directive's schema, wherever it is asked from, ends in this one call.
    monkeypatch.setattr(admission, "validate", counted)
    env = make_env(tmp_path)
    async with (
        running_connector(env, broker.url) as assembled,
        client(broker.url, env.tokens["alice"]) as bus,
    ):
        for op, directive in (
            ("scan-1", ble_scan(30)),
            ("redact-1", command_directive("whisper.redaction.prepare", input={"text": "a"})),
        ):
            checks.clear()
            await _once(assembled, bus.start(directive, op=op))
            assert checks[admission.DIRECTIVE_SCHEMA] == 1, op


async def test_cancel_checks_authority_once_and_reads_the_registry_once(
    tmp_path: Path, broker: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = make_env(tmp_path)
    async with (
        running_connector(env, broker.url) as assembled,
        client(broker.url, env.tokens["alice"]) as bus,
    ):
        await bus.start(ble_scan(30), op="cancel-1")
        checks, reads = _count_authority(monkeypatch), _count_reads(monkeypatch, assembled)
        assert (await _once(assembled, bus.cancel("cancel-1")))["cancelled"] is True
        assert checks["may_see"] == 1
        assert reads == Counter({"find_for": 1})


def _count_authority(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    checks: Counter[str] = Counter()
    real = authority.may_see

    def counted(*args: Any) -> bool:
        checks["may_see"] += 1
        return real(*args)

    monkeypatch.setattr(authority, "may_see", counted)
    return checks


def _count_reads(monkeypatch: pytest.MonkeyPatch, assembled: Assembled) -> Counter[str]:
    """Calls of the registry's point reads from outside it (its own `find_for` reads inside itself)."""
    reads: Counter[str] = Counter()
    registry = assembled.registry
    for name in ("find_for", "get"):
        real: Callable[..., Any] = getattr(registry, name)

        def counted(*args: Any, _name: str = name, _real: Callable[..., Any] = real) -> Any:
            reads[_name] += 1
            return _real(*args)

        monkeypatch.setattr(registry, name, counted)
    return reads
