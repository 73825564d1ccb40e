"""CONTRACT §8 against a real `serve` at its real bounds: idle connections, the 257th, a foreign `Host`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from connector.api.edge import HttpEdge
from tests.support.serving import serving_async
from tests.support.waiting import poll

pytestmark = pytest.mark.serve

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]
REQUEST = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
METRICS = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
OPEN_GAUGE = re.compile(rb"^sensorium_http_connections_open (\S+)$", re.MULTILINE)


@asynccontextmanager
async def raw_connections(port: int, count: int) -> AsyncIterator[list[Stream]]:
    """`count` TCP connections that send nothing, closed at the end."""
    opened: list[Stream] = []
    try:
        for _ in range(count):
            opened.append(await asyncio.open_connection("127.0.0.1", port))
        yield opened
    finally:
        for _, writer in opened:
            writer.close()
        for _, writer in opened:
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def answer_status(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    """Send one `GET /healthz` and read the status of its answer."""
    writer.write(REQUEST)
    async with asyncio.timeout(10):
        head = await reader.readuntil(b"\r\n\r\n")
    return int(head.split(b" ")[1])


async def open_connections(port: int) -> int:
    """The edge's admitted connections, its own included, from `/metrics` on a `Connection: close` request.

    The answer is read to the server's close: the server drops a connection from the count before it
    closes the socket (asyncio calls `connection_lost` first), so once this returns, its own is not counted.
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(METRICS)
        async with asyncio.timeout(10):
            raw = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    assert raw.startswith(b"HTTP/1.1 200 "), raw[:200]
    found = OPEN_GAUGE.search(raw.partition(b"\r\n\r\n")[2])
    assert found is not None, "no sensorium_http_connections_open on /metrics"
    return int(float(found.group(1)))


async def wait_no_other_connection(port: int) -> None:
    """Until the server counts only the polling connection: then the test's are all the cap counts.

    An earlier connection (the start-up `/healthz` probe's) may still be counted while its close is pending.
    """
    await poll(lambda: open_connections(port), lambda count: count == 1)


@pytest.mark.asyncio
async def test_200_idle_connections_do_not_slow_a_normal_client_and_a_foreign_host_gets_421(
    tmp_path: Path,
) -> None:
    args = ("--data-dir", tmp_path / "data", "--allowed-host", "bench.lan")
    async with serving_async(*args, log=tmp_path / "serve.log") as served:
        port = httpx.URL(served.base_url).port
        assert port is not None
        async with (
            raw_connections(port, 200) as idle,
            httpx.AsyncClient(base_url=served.base_url, timeout=10) as client,
        ):
            answers: list[tuple[str, int, float]] = []
            for host in ("127.0.0.1", "localhost", "bench.lan", "rebind.evil.example") * 5:
                started = time.monotonic()
                response = await client.get("/healthz", headers={"Host": f"{host}:{port}"})
                answers.append((host, response.status_code, time.monotonic() - started))
                if response.status_code == 421:
                    document = response.json()
                    assert document["schema"] == "sensorium-error.v1"
                    assert document["code"] == "misdirected-request" and "evil" not in response.text
            assert {(host, status) for host, status, _ in answers} == {
                ("127.0.0.1", 200),
                ("localhost", 200),
                ("bench.lan", 200),
                ("rebind.evil.example", 421),
            }
            assert max(seconds for *_, seconds in answers) < 1.0, answers
            assert await answer_status(*idle[-1]) == 200  # the idle ones are admitted, not queued
    assert "Traceback" not in served.log_text()


@pytest.mark.asyncio
async def test_the_257th_connection_is_answered_503_at_once_while_the_admitted_are_served(
    tmp_path: Path,
) -> None:
    cap = HttpEdge().max_connections
    async with serving_async("--data-dir", tmp_path / "data", log=tmp_path / "serve.log") as served:
        port = httpx.URL(served.base_url).port
        assert port is not None
        await wait_no_other_connection(port)
        async with raw_connections(port, cap) as admitted:
            # Accepted in order: once the last one is answered, every earlier one holds its slot.
            assert await answer_status(*admitted[-1]) == 200
            async with raw_connections(port, 1) as ((reader, _),):
                started = time.monotonic()
                async with asyncio.timeout(5):
                    raw = await reader.read()  # nothing sent: the answer comes on arrival
                waited = time.monotonic() - started
            head, _, body = raw.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503 ") and b"\r\nretry-after: 1" in head.lower()
            document = json.loads(body)
            assert document["schema"] == "sensorium-error.v1" and document["code"] == "overloaded"
            assert waited < 1.0
            for connection in (admitted[0], admitted[cap // 2]):
                assert await answer_status(*connection) == 200
    assert "Traceback" not in served.log_text()
