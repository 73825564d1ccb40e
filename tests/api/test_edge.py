"""CONTRACT §8 at the server's edge: read deadlines, the connection cap and the `Host` check.

The deadlines are real time by nature (the event loop's timers): these tests run the real listener and the
uvicorn server `serve` builds (`serve_cmd.listen`, `serve_cmd.http_server`) with short bounds, where the
behaviour is under test, and one test holds the defaults to the contract's numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from starlette.types import Receive, Scope, Send

from connector.api.edge import EdgeH11Protocol, HttpEdge, allowed_host_names, host_is_allowed
from connector.cli import serve_cmd
from connector.cli.main import build_parser
from tests.support.waiting import wait_until


@dataclass
class EchoApp:
    """An ASGI app that reads the whole body, then answers its length; it records what `receive` gave."""

    received: list[str] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        size = 0
        while True:
            message = await receive()
            self.received.append(message["type"])
            if message["type"] != "http.request":
                return
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = json.dumps({"bytes": size}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@dataclass
class Served:
    """A running server, its port and its app."""

    server: Any
    port: int
    app: EchoApp
    metrics: CollectorRegistry

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A raw TCP connection."""
        return await asyncio.open_connection("127.0.0.1", self.port)

    async def wait_open_connections(self, count: int) -> None:
        """Until the server holds `count` admitted connections (its own record)."""
        await wait_until(lambda: len(self.server.server_state.connections) == count)

    def open_gauge(self) -> float | None:
        """`sensorium_http_connections_open` as a scrape reads it now."""
        return self.metrics.get_sample_value("sensorium_http_connections_open")


@asynccontextmanager
async def running(edge: HttpEdge) -> AsyncIterator[Served]:
    """`serve`'s uvicorn server over the real listener, with `edge`, until the block ends."""
    app = EchoApp()
    metrics = CollectorRegistry()
    listener = serve_cmd.listen("127.0.0.1", 0)
    server = serve_cmd.http_server(app, edge, metrics)
    task = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        await wait_until(lambda: server.started)
        yield Served(server, listener.getsockname()[1], app, metrics)
    finally:
        server.should_exit = True
        await task
        listener.close()


@asynccontextmanager
async def connection(served: Served) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A raw connection, closed at the end whatever the server did to it."""
    reader, writer = await served.connect()
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Status, lower-case headers and body of one HTTP/1.1 answer."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    return int(status_line.split(" ")[1]), {k.lower(): v for k, v in headers.items()}, body


def assert_refusal(raw: bytes, status: int, code: str) -> dict[str, str]:
    """A `sensorium-error.v1` answer that closes the connection; returns its headers."""
    got, headers, body = parse(raw)
    assert got == status, raw
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    document = json.loads(body)
    assert document["schema"] == "sensorium-error.v1" and document["code"] == code
    assert int(headers["content-length"]) == len(body)
    return headers


REQUEST = b"GET /echo HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
SHORT = HttpEdge(header_seconds=1.0, body_seconds=1.0, keep_alive_seconds=30)


def test_the_defaults_are_the_contract_s() -> None:
    edge = HttpEdge()
    assert (edge.header_seconds, edge.body_seconds, edge.max_connections) == (10.0, 30.0, 256)
    assert edge.keep_alive_seconds < edge.header_seconds and edge.allowed_hosts == frozenset()


def test_serve_builds_its_server_with_the_default_edge(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[HttpEdge] = []

    def serve(_serve: object, _config: object, listener: socket.socket, edge: HttpEdge) -> None:
        listener.close()
        seen.append(edge)

    monkeypatch.setattr(anyio, "run", serve)
    argv = ["serve", "--data-dir", str(tmp_path), "--port", "0", "--allow-test-key"]
    args = build_parser().parse_args([*argv, "--allowed-host", "Bench.LAN."])
    assert serve_cmd.run(args) == 0
    assert seen == [HttpEdge(allowed_hosts=frozenset({"bench.lan"}))]
    server = serve_cmd.http_server(EchoApp(), seen[0])
    protocol = server.config.http
    assert isinstance(protocol, type) and issubclass(protocol, EdgeH11Protocol) and protocol.edge == seen[0]
    assert server.config.timeout_keep_alive == seen[0].keep_alive_seconds


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        (None, True),
        ("127.0.0.1", True),
        ("127.0.0.1:8787", True),
        ("[::1]:8787", True),
        ("[fe80::1%25eth0]", True),
        ("localhost", True),
        ("LOCALHOST:8787", True),
        ("localhost.", True),
        ("bench.lan:8787", True),
        ("evil.example", False),
        ("evil.example:8787", False),
        ("127.0.0.1.evil.example", False),
        ("localhost.evil.example", False),
        ("sub.bench.lan", False),
        ("", False),
        ("[::1", False),
        ("[evil.example]", False),
        ("localhost:http", False),
        ("::1", False),
    ],
)
def test_which_hosts_are_answered(host: str | None, allowed: bool) -> None:
    assert host_is_allowed(host, frozenset({"bench.lan"})) is allowed


@pytest.mark.parametrize("name", ["", "bench.lan:8787", "http://bench.lan", "[::1]"])
def test_an_allowed_host_is_a_bare_name(name: str) -> None:
    with pytest.raises(ValueError, match="--allowed-host"):
        allowed_host_names([name])


@pytest.mark.realtime  # a real uvicorn server on a socket: the deadlines are its own
@pytest.mark.asyncio
async def test_a_slowloris_client_is_cut_at_the_header_deadline() -> None:
    """One byte a second: each byte arrives well within a second, yet the headers' deadline holds."""
    edge = HttpEdge(header_seconds=3.0)
    request = b"GET /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 40 + b"\r\n\r\n"
    async with running(edge) as served, connection(served) as (reader, writer):
        loop = asyncio.get_running_loop()
        opened = loop.time()
        sent = 0

        async def one_byte_a_second() -> None:
            nonlocal sent
            with contextlib.suppress(OSError):
                for byte in request:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    sent += 1
                    await asyncio.sleep(1.0)  # real peer: a slowloris client

        dribble = asyncio.create_task(one_byte_a_second())
        async with asyncio.timeout(20):
            raw = await reader.read()
        closed = loop.time()
        dribble.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await dribble
        assert_refusal(raw, 408, "request-timeout")
        assert 2 <= sent < len(request)  # bytes kept coming, and the headers were cut all the same
        assert closed - opened >= edge.header_seconds - 0.01
        await served.wait_open_connections(0)
        assert served.app.received == []  # the app never saw the request


@pytest.mark.realtime  # a real uvicorn server on a socket: the deadlines are its own
@pytest.mark.asyncio
async def test_headers_then_no_body_is_answered_408_and_the_app_sees_a_disconnect() -> None:
    async with running(SHORT) as served, connection(served) as (reader, writer):
        writer.write(b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\n12345")
        loop = asyncio.get_running_loop()
        sent_headers = loop.time()
        async with asyncio.timeout(10):
            raw = await reader.read()
        assert loop.time() - sent_headers >= SHORT.body_seconds - 0.01
        assert_refusal(raw, 408, "request-timeout")
        await wait_until(lambda: served.app.received[-1:] == ["http.disconnect"])
        await served.wait_open_connections(0)


@pytest.mark.realtime  # a real uvicorn server on a socket: the deadlines are its own
@pytest.mark.asyncio
async def test_a_body_in_time_is_answered_and_the_connection_kept() -> None:
    async with running(SHORT) as served, connection(served) as (reader, writer):
        for _ in range(2):
            writer.write(b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 4\r\n\r\nabcd")
            async with asyncio.timeout(10):
                head = await reader.readuntil(b"\r\n\r\n")
                status, headers, _ = parse(head)
                body = await reader.readexactly(int(headers["content-length"]))
            assert status == 200 and json.loads(body) == {"bytes": 4}
        assert len(served.server.server_state.connections) == 1


@pytest.mark.realtime  # a real uvicorn server on a socket: the deadlines are its own
@pytest.mark.asyncio
async def test_on_a_kept_alive_connection_the_headers_are_due_from_the_previous_response() -> None:
    async with running(SHORT) as served, connection(served) as (reader, writer):
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0.7)  # real peer: a client that waits before its first request
        requested = loop.time()  # before the response, so before the deadline it starts
        writer.write(REQUEST)
        async with asyncio.timeout(10):
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(int(parse(head)[1]["content-length"]))
        writer.write(REQUEST[:10])  # part of the next request, never the rest
        async with asyncio.timeout(10):
            raw = await reader.read()
        # Counted from the opening, the deadline would have passed 0.7 s into the connection's first second.
        assert loop.time() - requested >= SHORT.header_seconds - 0.01
        assert_refusal(raw, 408, "request-timeout")


@pytest.mark.realtime  # a real uvicorn server on a socket: the deadlines are its own
@pytest.mark.asyncio
async def test_an_idle_connection_is_closed_at_the_header_deadline_without_an_answer() -> None:
    async with running(SHORT) as served, connection(served) as (reader, _):
        await served.wait_open_connections(1)
        async with asyncio.timeout(10):
            assert await reader.read() == b""
        await served.wait_open_connections(0)


@pytest.mark.realtime  # a real uvicorn server on a socket: the deadlines are its own
@pytest.mark.asyncio
async def test_beyond_the_cap_a_connection_is_answered_503_at_once_and_the_admitted_are_served() -> None:
    edge = HttpEdge(max_connections=4, header_seconds=30, keep_alive_seconds=30)
    async with running(edge) as served, contextlib.AsyncExitStack() as stack:
        admitted = [await stack.enter_async_context(connection(served)) for _ in range(4)]
        await served.wait_open_connections(4)
        reader, _ = await stack.enter_async_context(connection(served))
        async with asyncio.timeout(5):
            raw = await reader.read()  # nothing sent: answered on arrival
        headers = assert_refusal(raw, 503, "overloaded")
        assert headers["retry-after"] == str(edge.overloaded_retry_after_seconds)
        assert json.loads(parse(raw)[2])["retry_after_seconds"] == edge.overloaded_retry_after_seconds
        assert len(served.server.server_state.connections) == 4
        for admitted_reader, admitted_writer in admitted:
            admitted_writer.write(REQUEST)
            async with asyncio.timeout(10):
                status = parse(await admitted_reader.readuntil(b"\r\n\r\n"))[0]
            assert status == 200


@pytest.mark.realtime  # a real uvicorn server on a socket: the deadlines are its own
@pytest.mark.asyncio
async def test_the_open_connections_gauge_is_the_count_the_cap_compares_with() -> None:
    edge = HttpEdge(max_connections=2, header_seconds=30, keep_alive_seconds=30)
    async with running(edge) as served, contextlib.AsyncExitStack() as stack:
        assert served.open_gauge() == 0
        assert b"# TYPE sensorium_http_connections_open gauge" in generate_latest(served.metrics)
        admitted = [await stack.enter_async_context(connection(served)) for _ in range(2)]
        await served.wait_open_connections(2)
        assert served.open_gauge() == 2
        reader, _ = await stack.enter_async_context(connection(served))
        async with asyncio.timeout(5):
            assert_refusal(await reader.read(), 503, "overloaded")
        assert served.open_gauge() == 2  # the refused connection is not counted
        admitted[0][1].close()
        await served.wait_open_connections(1)
        assert served.open_gauge() == 1
    async with running(SHORT) as served, connection(served) as (reader, writer):
        writer.write(b"GET /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        async with asyncio.timeout(10):
            raw = await reader.read()
        assert parse(raw)[0] == 200
        # Read to the server's close, a `Connection: close` answer's connection is no longer counted:
        # what the e2e test relies on when it polls `/metrics` before filling the cap.
        assert served.open_gauge() == 0


@pytest.mark.realtime  # a real uvicorn server on a socket: the deadlines are its own
@pytest.mark.asyncio
async def test_a_foreign_host_is_answered_421_before_the_app() -> None:
    edge = HttpEdge(allowed_hosts=frozenset({"bench.lan"}))
    async with running(edge) as served:
        hosts = ((b"rebind.evil.example:8787", 421), (b"bench.lan:8787", 200), (b"localhost", 200))
        for host, status in hosts:
            async with connection(served) as (reader, writer):
                writer.write(b"GET /echo HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n")
                async with asyncio.timeout(10):
                    raw = await reader.read()
            assert parse(raw)[0] == status, host
            if status == 421:
                document = json.loads(parse(raw)[2])
                assert document["code"] == "misdirected-request" and b"evil" not in raw
        assert served.app.received == ["http.request", "http.request"]
