"""A real lab on loopback (CONTRACT §15): two clustered nats-servers under the shipped permissions, nkey users
made at test time, `serve --node` processes, the `lab` view, a sniffer on `>` and a signed-in page client."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from html import unescape
from pathlib import Path
from typing import Any

import httpx
import nats
import nkeys
from nats.aio.client import Client

from tests.bus.broker import nats_server_binary
from tests.support.paths import REPO
from tests.support.serving import ServeProcess, cli_argv, spawn, start_serve

PERMISSIONS = REPO / "docs" / "lab" / "permissions.conf"
ROLES = {"node-a": "NODE_A", "node-b": "NODE_B", "node-c": "NODE_C", "caller": "CALLER", "lab": "LAB_VIEW"}
SNIFFER = "sniffer"  # a test-only user with no subject permissions: it may subscribe to `>`
_SERVING = re.compile(r"lab serving on (http://[0-9.]+:[0-9]+)/lab")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (nats-server's route ports must be known before it starts)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_users(directory: Path) -> dict[str, Path]:
    """An nkey seed file (0600) per user, generated now; answers the seed paths by user."""
    directory.mkdir(parents=True, exist_ok=True)
    seeds = {}
    for user in [*ROLES, SNIFFER]:
        seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
        path = directory / f"{user}.nk"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(seed + b"\n")
        seeds[user] = path
    return seeds


def public_key(seed: Path) -> str:
    """The public nkey of a seed file."""
    return str(nkeys.from_seed(seed.read_bytes().strip()).public_key.decode())


def server_config(port: int, cluster_port: int, peer_port: int, seeds: Mapping[str, Path]) -> str:
    """One server of the lab cluster: the shipped permissions, nkey users, a route to the peer."""
    users = [f'{{ nkey: "{public_key(seeds[u])}", permissions: ${role} }}' for u, role in ROLES.items()]
    users.append(f'{{ nkey: "{public_key(seeds[SNIFFER])}" }}')
    return "\n".join(
        [
            f"listen: 127.0.0.1:{port}",
            f"server_name: lab-{port}",
            'include "permissions.conf"',
            "accounts {",
            "  LAB {",
            "    users = [",
            *(f"      {u}" for u in users),
            "    ]",
            "  }",
            "}",
            "cluster {",
            "  name: lab",
            f"  listen: 127.0.0.1:{cluster_port}",
            f'  routes: ["nats-route://127.0.0.1:{peer_port}"]',
            "}",
        ]
    )


@dataclass(slots=True)
class ClusterServer:
    """One nats-server of the cluster, started from its config file."""

    workdir: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """`nats://127.0.0.1:PORT`."""
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start and wait until the client port accepts connections."""
        argv = [str(nats_server_binary()), "-c", str(self.workdir / "server.conf")]
        argv += ["-l", str(self.workdir / "server.log")]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nats-server exited: see {self.workdir / 'server.log'}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)  # real peer: polls a real nats-server
        raise RuntimeError("nats-server did not start")

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM and reap."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def start_cluster(root: Path, seeds: Mapping[str, Path]) -> list[ClusterServer]:
    """Two nats-servers routed to each other, each with the shipped permissions file beside its config."""
    ports = [free_port() for _ in range(4)]
    servers = []
    for index in range(2):
        workdir = root / f"nats-{index}"
        workdir.mkdir(parents=True)
        (workdir / "permissions.conf").write_text(PERMISSIONS.read_text())
        peer = ports[2 + (1 - index)]
        (workdir / "server.conf").write_text(server_config(ports[index], ports[2 + index], peer, seeds))
        servers.append(ClusterServer(workdir, ports[index]))
    for server in servers:
        server.start()
    return servers


# ---- NATS requests from the test -----------------------------------------------------------------------


async def _connect(urls: str, seed: Path, **options: Any) -> Client:
    return await nats.connect(servers=urls.split(","), nkeys_seed=str(seed), connect_timeout=3, **options)


async def _requests(
    urls: str, seed: Path, calls: list[tuple[str, Mapping[str, Any], str | None]]
) -> list[dict[str, Any]]:
    nc = await _connect(urls, seed)
    try:
        answers = []
        for subject, body, token in calls:
            headers = {"Authorization": f"Bearer {token}"} if token else None
            reply = await nc.request(subject, json.dumps(body).encode(), timeout=10, headers=headers)
            answers.append(json.loads(reply.data))
        return answers
    finally:
        await nc.close()


def requests(
    urls: str, seed: Path, calls: list[tuple[str, Mapping[str, Any], str | None]]
) -> list[dict[str, Any]]:
    """Requests in order over one connection as the seed's user; their decoded replies."""
    return asyncio.run(_requests(urls, seed, calls))


def request(
    urls: str, seed: Path, subject: str, body: Mapping[str, Any], token: str | None
) -> dict[str, Any]:
    """One request; its decoded reply."""
    return requests(urls, seed, [(subject, body, token)])[0]


async def _gather(urls: str, seed: Path, subject: str, wait: float, **options: Any) -> list[dict[str, Any]]:
    nc = await _connect(urls, seed, **options)
    try:
        inbox, answers = nc.new_inbox(), []

        async def on_answer(msg: Any) -> None:
            answers.append(json.loads(msg.data))

        await nc.subscribe(inbox, cb=on_answer)
        await nc.publish(subject, b"", reply=inbox)
        await nc.flush()
        await asyncio.sleep(wait)  # real peer: a services request gathers every answer within a window
        return answers
    finally:
        await nc.close()


def gather(urls: str, seed: Path, subject: str, wait: float = 1.0, **options: Any) -> list[dict[str, Any]]:
    """Every answer to a `$SRV.*` request within `wait` seconds (`options`: nats-py `connect` keywords)."""
    return asyncio.run(_gather(urls, seed, subject, wait, **options))


async def _violations(urls: str, seed: Path, subscribe: list[str], publish: list[str]) -> list[str]:
    errors: list[str] = []

    async def on_error(error: Exception) -> None:
        errors.append(str(error))

    nc = await _connect(urls, seed, error_cb=on_error)
    try:

        async def ignore(msg: Any) -> None:
            return None

        for subject in subscribe:
            await nc.subscribe(subject, cb=ignore)
        for subject in publish:
            await nc.publish(subject, b"{}")
        await nc.flush()
        deadline = time.monotonic() + 5
        while len(errors) < len(subscribe) + len(publish) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # real peer: the server reports each violation asynchronously
        return errors
    finally:
        await nc.close()


def violations(urls: str, seed: Path, *, subscribe: list[str] = [], publish: list[str] = []) -> list[str]:  # noqa: B006
    """The permission violations the server reports for these subscriptions and publications."""
    return asyncio.run(_violations(urls, seed, subscribe, publish))


# ---- processes ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Node:
    """One `serve --node` with its data dir and tokens."""

    name: str
    data_dir: Path
    argv: list[str | Path]
    log: Path
    operator: str
    caller: str
    revoked_operator: str = ""
    process: ServeProcess | None = None
    starts: int = 0

    def start(self) -> ServeProcess:
        """Start (again) with the same arguments and a fresh log; returns once healthy."""
        self.starts += 1
        log = self.log.with_name(f"{self.log.stem}-{self.starts}.log")
        self.process = start_serve(*self.argv, log=log, timeout=60)
        return self.process

    @property
    def base_url(self) -> str:
        """The running process's HTTP base URL."""
        assert self.process is not None
        return self.process.base_url


@dataclass(slots=True)
class LabView:
    """The running `lab` process and a signed-in page client."""

    process: subprocess.Popen[bytes]
    base_url: str
    data_dir: Path
    client: httpx.Client = field(init=False)

    def sign_in(self, token: str) -> None:
        """The console's sign-in: a nonce cookie, the token, a session cookie."""
        self.client = httpx.Client(base_url=self.base_url, timeout=10)
        form = self.client.get("/lab/sign-in")
        nonce = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
        assert nonce is not None
        signed = self.client.post("/lab/sign-in", data={"csrf_token": nonce.group(1), "token": token})
        assert signed.status_code == 303 and signed.headers["location"] == "/lab"

    def page(self, **query: str) -> str:
        """`/lab` as HTML."""
        response = self.client.get("/lab", params=query)
        assert response.status_code == 200, response.status_code
        return response.text

    def stop(self) -> None:
        """SIGTERM, else SIGKILL."""
        if hasattr(self, "client"):
            self.client.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def start_lab(urls: str, nodes_file: Path, data_dir: Path, seed: Path, log: Path) -> LabView:
    """`lab --nats URLS --nodes FILE` on an OS-chosen port; returns once it logged its URL."""
    argv = cli_argv("lab", "--nats", urls, "--nodes", nodes_file, "--data-dir", data_dir, "--port", "0")
    process = spawn([*argv, "--nats-creds", str(seed)], log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = _SERVING.search(log.read_text(errors="replace"))
        if found:
            return LabView(process, found.group(1), data_dir)
        if process.poll() is not None:
            raise RuntimeError(f"lab exited with {process.returncode}: see {log}")
        time.sleep(0.05)  # real peer: polls a real lab process
    process.kill()
    raise RuntimeError("lab did not start")


def write_nodes_file(path: Path, tokens: Mapping[str, str]) -> Path:
    """The nodes FILE, 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(dict(tokens), out)
    return path


def start_sniffer(urls: str, seed: Path, out: Path, log: Path) -> subprocess.Popen[bytes]:
    """`python -m tests.lab.sniffer`: every message on `>` (subject, headers, payload) into `out`."""
    argv = [sys.executable, "-m", "tests.lab.sniffer", urls, str(seed), str(out)]
    process = spawn(argv, log)
    deadline = time.monotonic() + 20
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # real peer: polls a real sniffer process
    return process


# ---- reading the page ------------------------------------------------------------------------------------

_ROW = re.compile(
    r'<tr data-node="(?P<node>[^"]*)" data-status="(?P<status>[^"]*)" data-operation="(?P<op>[^"]*)"'
    r'(?P<unreachable> class="unreachable")?>.*?<td class="mono outcome"[^>]*>(?P<outcome>[^<]*)</td>',
    re.S,
)
_LINE = re.compile(
    r'<li class="(?P<cls>reachable|unreachable)" data-node="(?P<node>[^"]*)">(?P<body>.*?)</li>', re.S
)


@dataclass(frozen=True, slots=True)
class PageRow:
    """One row of the table as the page shows it."""

    node: str
    status: str
    operation_id: str
    unreachable: bool
    outcome: str


def page_rows(html: str) -> list[PageRow]:
    """The table's rows."""
    return [
        PageRow(
            m["node"], m["status"], unescape(m["op"]), bool(m["unreachable"]), unescape(m["outcome"]).strip()
        )
        for m in _ROW.finditer(html)
    ]


def page_lines(html: str) -> dict[str, str]:
    """Each node's line: its text with tags removed."""
    return {
        m["node"]: re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", m["body"])).strip()
        for m in _LINE.finditer(html)
    }


def wait_page(view: LabView, check: Any, timeout: float, **query: str) -> tuple[str, float]:
    """Poll the page until `check(html)` holds; the page and the time it took (raises after `timeout`)."""
    started = time.monotonic()
    while True:
        html = view.page(**query)
        if check(html):
            return html, time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise AssertionError(f"the page did not show it within {timeout} s")
        time.sleep(0.1)  # real peer: polls a real lab page


def page_total(html: str) -> int:
    """How many rows the table holds over all its pages (0 without any)."""
    found = re.search(r'id="count" data-total="([0-9]+)"', html)
    return int(found.group(1)) if found else 0


def all_rows(view: LabView, **query: str) -> list[PageRow]:
    """Every row of the table, page after page."""
    rows: list[PageRow] = []
    number = 1
    while True:
        html = view.page(**query, page=str(number))
        rows += page_rows(html)
        if 'id="next"' not in html:
            return rows
        number += 1
