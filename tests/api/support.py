"""Helpers for the service tests: a signed test catalog, principals, a recording provider factory, a harness
that assembles one connector in-process and talks to it over httpx `ASGITransport`, and directive builders."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from connector.assembly import Assembled, ConnectorConfig, assemble
from connector.contract.validate import validate
from connector.core.authority import Grant, make_grant
from connector.core.observations import BleObservation, Observation
from connector.storage.state import STATE_RELATIVE_PATH
from connector.timer import WALL_TIMER, Timer, VirtualTimer
from providers.faults import Fault, FaultProvider
from tests.support.catalogs import command_action, example_catalog, new_operator, signed_catalog
from tests.support.clocks import OffsetClock
from tests.support.directives import HEART_RATE
from tests.support.paths import HW_FIXTURES
from tests.support.principals import Tokens, create_principals
from tests.support.waiting import poll

HEART_RATE_LAB = HW_FIXTURES / "ble-heart-rate-lab.jsonl"

SCAN = "device.discovery.scan"
REDACT = "whisper.redaction.prepare"
INFO = "sensorium.os.info"
SLEEP = "test.sleep"
STUBBORN = "test.stubborn"
TERMINAL = frozenset({"completed", "failed", "timed-out", "cancelled", "expired", "unknown"})
CANARY = "CANARY-h10-5e1f0c9a"

# `python3 -c`: write the pid to the marker (atomically), then sleep; SIGTERM ends it.
_SLEEPER = (
    "import os,sys,time,pathlib;p=pathlib.Path(sys.argv[1]);t=p.with_suffix('.tmp');"
    "t.write_text(str(os.getpid()));t.replace(p);time.sleep(float(sys.argv[2]))"  # real peer: its run
)

CALLER_GRANTS = (SCAN, REDACT, INFO, SLEEP, STUBBORN)


def write_test_catalog(
    base: Path, marker: Path, *, result_retention_seconds: int | None = None
) -> tuple[Path, Path]:
    """The shipped catalog plus two sleeping command actions, signed by a fresh key; (catalog, trust dir)."""
    if (base / "actions.json").exists():  # a restart over the same directory: the same signed catalog
        return base / "actions.json", base / "trust"
    document = example_catalog()
    if result_retention_seconds is not None:
        document["actions"][0]["discovery"]["result_retention_seconds"] = result_retention_seconds
    sleepers = [
        _sleeper(SLEEP, marker, support="either", cancel="terminate"),
        _sleeper(STUBBORN, marker.with_name(marker.name + ".stubborn"), support="async-only", cancel="none"),
    ]
    operator = new_operator(base)
    catalog = signed_catalog(base, sleepers, document=document, private_key=operator.private_key)
    return catalog, operator.trust_dir


def _sleeper(action_id: str, marker: Path, *, support: str, cancel: str) -> dict[str, Any]:
    argv = ["python3", "-c", _SLEEPER, str(marker), "30"]
    return command_action(action_id, argv, cancel=cancel, support=support, ttl_seconds=120)


def add_test_principals(data_dir: Path) -> Tokens:
    """alice and bob (callers with every grant), carol (scan on mdns only), root (operator): their tokens."""
    callers: dict[str, Sequence[str | Grant]] = {
        "alice": CALLER_GRANTS,
        "bob": CALLER_GRANTS,
        "carol": [make_grant(SCAN, ["mdns"])],
    }
    return create_principals(data_dir, callers, ["root"])


def strap(index: int, *, rssi: int = -60) -> BleObservation:
    """An in-scope heart-rate strap with a synthetic address and a name."""
    return BleObservation(
        address=f"02:00:00:00:{index // 256:02X}:{index % 256:02X}",
        rssi=rssi,
        name=f"strap-{index}",
        service_uuids=(HEART_RATE,),
    )


def straps(count: int, *, at_ms: int = 0, step_ms: int = 0) -> list[tuple[int, Observation]]:
    """`count` straps appearing from `at_ms`, `step_ms` apart."""
    return [(at_ms + i * step_ms, strap(i)) for i in range(count)]


class RecordingFactory:
    """A provider factory (`assemble(providers=...)`) building fault providers and recording every call."""

    def __init__(
        self,
        timeline: Sequence[tuple[int, Observation]] = (),
        *,
        concurrent: bool = False,
        fault: Fault | None = None,
        timer: Timer | None = None,
    ) -> None:
        self.timeline = tuple(timeline)
        self.timer = timer  # None: the harness hands it the connector's own timer
        self.concurrent = concurrent
        self.fault = fault
        self.requests: list[tuple[str, str | None]] = []
        self.built: list[FaultProvider] = []

    def __call__(self, transport: str, adapter: str | None) -> FaultProvider:
        self.requests.append((transport, adapter))
        provider = FaultProvider(
            self.timeline,
            transport=transport,  # type: ignore[arg-type]
            concurrent_sessions=self.concurrent,
            fault=self.fault,
            timer=self.timer or WALL_TIMER,
        )
        self.built.append(provider)
        return provider

    @property
    def starts(self) -> int:
        """Provider `start()` calls over every provider built."""
        return sum(provider.start_calls for provider in self.built)

    @property
    def acknowledged_stops(self) -> int:
        """Acknowledged `stop()` calls over every provider built."""
        return sum(provider.acknowledged_stops for provider in self.built)


@dataclass
class Harness:
    """One assembled connector, an httpx client on its app, and the principals' tokens."""

    assembled: Assembled
    client: httpx.AsyncClient
    tokens: Tokens
    data_dir: Path
    clock: OffsetClock
    marker: Path
    factory: RecordingFactory | None = None
    submits: list[str] = field(default_factory=list)
    timer: VirtualTimer | None = None

    def auth(self, who: str) -> dict[str, str]:
        """The Authorization header of a principal (or of a literal token when `who` is unknown)."""
        return {"Authorization": f"Bearer {self.tokens.get(who, who)}"}

    async def invoke(self, who: str | None, directive: Any) -> httpx.Response:
        """POST /v1/directives as `who` (None: without a token)."""
        headers = self.auth(who) if who is not None else {}
        return await self.client.post("/v1/directives", json=directive, headers=headers)

    async def get(self, who: str, path: str, **params: Any) -> httpx.Response:
        """GET with `who`'s token."""
        return await self.client.get(path, headers=self.auth(who), params=params or None)

    async def post(self, who: str, path: str, body: Any = None) -> httpx.Response:
        """POST a JSON body with `who`'s token."""
        return await self.client.post(path, json=body, headers=self.auth(who))

    async def poll(
        self,
        who: str,
        location: str,
        until: Callable[[dict[str, Any]], bool] = lambda doc: doc["status"] in TERMINAL,
        *,
        timeout: float = 15.0,
        interval: float = 0.05,
    ) -> list[dict[str, Any]]:
        """Poll a status until `until` holds; every poll is returned (the last one satisfies `until`).

        On a VirtualTimer the clock moves from due moment to due moment between polls (see `settle`);
        on the wall clock the polls wait on real time (`timeout`, `interval`).
        """
        if self.timer is not None:
            return await self._settled(who, location, until)

        async def get() -> dict[str, Any]:
            return await self._status(who, location)

        return await poll(get, until, timeout=timeout, interval=interval)

    async def settle(
        self,
        who: str,
        location: str,
        until: Callable[[dict[str, Any]], bool] = lambda doc: doc["status"] in TERMINAL,
    ) -> dict[str, Any]:
        """Advance the virtual clock from due moment to due moment until a status satisfies `until`."""
        return (await self._settled(who, location, until))[-1]

    async def _settled(
        self, who: str, location: str, until: Callable[[dict[str, Any]], bool]
    ) -> list[dict[str, Any]]:
        """Every status read while the virtual clock advanced (the last one satisfies `until`)."""
        assert self.timer is not None, "settling needs a harness on a VirtualTimer"
        await self.timer.advance(0)
        documents = [await self._status(who, location)]
        while not until(documents[-1]):
            due_ms = self.timer.next_due_ms()
            assert due_ms is not None, documents[-1]
            await self.timer.advance_to(due_ms)
            documents.append(await self._status(who, location))
        return documents

    async def _status(self, who: str, location: str) -> dict[str, Any]:
        response = await self.get(who, location)
        assert response.status_code == 200, response.text
        document: dict[str, Any] = response.json()
        return document

    def command_rows(self) -> list[tuple[Any, ...]]:
        """Every row of the command operations table (read through a second connection)."""
        return query(self.data_dir, "SELECT operation_id, owner, action_id, status FROM command_operations")


@asynccontextmanager
async def harness(
    tmp_path: Path,
    *,
    factory: RecordingFactory | None = None,
    replay: Mapping[str, Path] | None = None,
    replay_speed: float = 10.0,
    clock: OffsetClock | None = None,
    max_body_bytes: int = 65536,
    result_retention_seconds: int | None = None,
    tokens: Tokens | None = None,
    timer: VirtualTimer | None = None,
    wall: bool = False,
) -> AsyncIterator[Harness]:
    """Assemble a connector over a fresh data dir with the test catalog and principals; yield a harness.

    With the `tokens` of an earlier harness over the same `tmp_path`, the connector restarts over its data.
    The runtime waits on a `VirtualTimer` and "now" is derived from it (the given one, else a fresh one),
    unless the test needs the wall clock: `wall=True` (real command processes), or a shifted `clock`.
    """
    if timer is None and not wall and clock is None:
        timer = VirtualTimer()
    if factory is not None and factory.timer is None:
        factory.timer = timer or WALL_TIMER
    data_dir = tmp_path / "data"
    marker = tmp_path / "sleeper.pid"
    catalog, trust = write_test_catalog(
        tmp_path / "catalog", marker, result_retention_seconds=result_retention_seconds
    )
    tokens = tokens if tokens is not None else add_test_principals(data_dir)
    config = ConnectorConfig(
        data_dir=data_dir,
        catalog=catalog,
        trust_dir=trust,
        replay=dict(replay or {}),
        replay_speed=replay_speed,
        max_body_bytes=max_body_bytes,
    )
    clock = clock or OffsetClock()
    async with assemble(config, providers=factory, **_time_sources(clock, timer)) as assembled:
        transport = httpx.ASGITransport(app=assembled.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://connector.test") as client:
            h = Harness(assembled, client, tokens, data_dir, clock, marker, factory, timer=timer)
            _record_submits(h)
            yield h


def _time_sources(clock: OffsetClock, timer: VirtualTimer | None) -> dict[str, Any]:
    """`assemble`'s time arguments: the timer alone (the clock derived from it), else the shifted clock."""
    return {"timer": timer} if timer is not None else {"clock": clock}


def _record_submits(h: Harness) -> None:
    """Wrap the command runner's `submit` so tests can tell that no process was started."""
    runner = h.assembled.commands
    original = runner.submit

    async def recording_submit(operation_id: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        h.submits.append(operation_id)
        return await original(operation_id, *args, **kwargs)

    runner.submit = recording_submit  # type: ignore[method-assign]


def query(data_dir: Path, sql: str) -> list[tuple[Any, ...]]:
    """Rows of a read-only query on the connector state database."""
    connection = sqlite3.connect(f"file:{data_dir / STATE_RELATIVE_PATH}?mode=ro", uri=True)
    try:
        return list(connection.execute(sql))
    finally:
        connection.close()


def files_bytes(root: Path) -> bytes:
    """The concatenated bytes of every file under `root` (database, WAL, principals, catalog state)."""
    return b"".join(path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file())


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """A `sensorium-error.v1` refusal with this HTTP status and code (validated); returns the body."""
    assert response.status_code == status, (response.status_code, response.text)
    body: dict[str, Any] = response.json()
    assert body["code"] == code, body
    assert validate("sensorium-error.v1", body) == [], body
    if code in ("too-many-operations", "transport-claimed", "session-not-terminated"):
        assert int(response.headers["retry-after"]) >= 1
        assert body["retry_after_seconds"] == int(response.headers["retry-after"])
    return body


def assert_valid(schema: str, document: Any) -> None:
    """No contract violation (a status schema also takes a list of successive polls)."""
    violations = validate(schema, document)
    assert violations == [], [str(v) for v in violations]


def candidates_of(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The candidates a status carries (running snapshot, else completed result)."""
    progress = document.get("progress") or {}
    snapshot = (progress.get("snapshot") or {}).get("candidates")
    if snapshot:
        return list(snapshot)
    return list((document.get("result") or {}).get("candidates") or [])


def has_candidates(document: Mapping[str, Any]) -> bool:
    """True when a status carries at least one candidate."""
    return bool(candidates_of(document))
