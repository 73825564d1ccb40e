"""Lab benchmark (CONTRACT §15): three `serve --simulate --node` processes and the `lab` view on one loopback
nats-server, each node holding `--operations` retained operations (default 1,000).

Phases:
- fill: each node gets its operations over its own Bus subjects (scans started and cancelled in turn, one
  worker per transport, so no claim refuses); then the view must list all of them;
- page: `--pages` sequential `GET /lab` (every node, the table's first page of 200 rows, the count of all),
  signed in as a lab operator; p95 target <= 300 ms;
- done-to-row: `--samples` 1 s scans, round robin over the nodes; for each, the time from the bench receiving
  the node's `op.done` to the view's page no longer listing the operation as running (polled every 10 ms
  on `/lab?node=N&status=running`); p95 target <= 1 s.

Usage (from the repo root): `.venv/bin/python bench/lab.py [--operations 1000] [--pages 50] [--samples 20]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

import httpx  # noqa: E402
import nats  # noqa: E402

from connector.core.authority import make_grant  # noqa: E402
from connector.storage.principals import add_principal  # noqa: E402
from connector.testing import wait_serving  # noqa: E402

SCAN = "device.discovery.scan"
NODES = ("a", "b", "c")
FILTERS = {
    "ble": {"service_uuids": ["0000180d-0000-1000-8000-00805f9b34fb"]},
    "mdns": {"service_types": ["_http._tcp.local."]},
    "usb-serial": {"vid_pid": [{"vid": 0x1209, "pid": 1}]},
}
PAGE_TARGET_MS, DONE_TARGET_MS = 300.0, 1000.0
_LAB_URL = re.compile(r"lab serving on (http://[0-9.]+:[0-9]+)/lab")


def scan(transport: str, window: int) -> dict[str, Any]:
    """An async v2 discovery directive."""
    return {
        "schema": "sensorium-directive.v1",
        "action_id": SCAN,
        "timing": {"mode": "async", "status_versions": [2]},
        "input": {"transport": transport, "window_seconds": window, "filters": FILTERS[transport]},
    }


def p95(values: Sequence[float]) -> float:
    """The 95th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    """A `python -m connector` process in the repo root, stderr to `log`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    with log.open("ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "connector", *argv],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )


def nats_server(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A broker on a random loopback port; its URL from the ports file."""
    binary = Path(sys.executable).parent / "nats-server"
    argv = [str(binary), "-a", "127.0.0.1", "-p", "-1", "--ports_file_dir", str(workdir)]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ports = workdir / f"nats-server_{process.pid}.ports"
    deadline = time.monotonic() + 10
    while not ports.exists() or not ports.read_text().strip().endswith("}"):
        if time.monotonic() > deadline:
            raise RuntimeError("nats-server did not start")
        time.sleep(0.01)
    return process, str(json.loads(ports.read_text())["nats"][0])


async def fill(url: str, node: str, token: str, count: int) -> None:
    """`count` operations on the node: scans started and cancelled, one worker per transport."""
    nc = await nats.connect(url)
    headers = {"Authorization": f"Bearer {token}"}
    remaining = [count]

    async def worker(transport: str) -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            while True:
                body = json.dumps({"directive": scan(transport, 60)}).encode()
                reply = json.loads(
                    (await nc.request(f"sensorium-os.{node}.op.start", body, 10, headers=headers)).data
                )
                code = reply.get("error", {}).get("code")
                if code is None:
                    break
                if code != "transport-claimed":
                    raise RuntimeError(f"op.start refused: {code}")
                await asyncio.sleep(0.02)  # the previous scan's stop is being confirmed (transport-claimed)
            cancel = json.dumps({"op": reply["op"]}).encode()
            await nc.request(f"sensorium-os.{node}.op.cancel", cancel, 10, headers=headers)

    try:
        await asyncio.gather(*(worker(t) for t in FILTERS))
    finally:
        await nc.close()


async def sign_in(client: httpx.AsyncClient, token: str) -> None:
    """The view's sign-in form: nonce cookie, token, session cookie."""
    form = await client.get("/lab/sign-in")
    nonce = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
    assert nonce is not None
    answer = await client.post("/lab/sign-in", data={"csrf_token": nonce.group(1), "token": token})
    assert answer.status_code == 303, answer.status_code


def rows(html: str, status: str | None = None) -> list[str]:
    """Operation ids of the page's rows (optionally of one status)."""
    pattern = r'data-status="([^"]*)" data-operation="([^"]*)"'
    return [op for found, op in re.findall(pattern, html) if status in (None, found)]


def total(html: str) -> int:
    """The table's row count over all its pages."""
    found = re.search(r'id="count" data-total="([0-9]+)"', html)
    return int(found.group(1)) if found else 0


async def wait_listed(client: httpx.AsyncClient, expected: int, timeout: float = 300) -> None:
    """Until the view lists every operation of every node."""
    deadline = time.monotonic() + timeout
    while total((await client.get("/lab")).text) < expected:
        if time.monotonic() > deadline:
            raise RuntimeError("the view did not list every operation")
        await asyncio.sleep(0.5)


async def page_latencies(client: httpx.AsyncClient, count: int) -> list[float]:
    """Milliseconds per full `GET /lab`."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        answer = await client.get("/lab")
        times.append((time.perf_counter() - started) * 1000)
        assert answer.status_code == 200
    return times


async def done_latencies(
    url: str, client: httpx.AsyncClient, tokens: dict[str, str], count: int
) -> list[float]:
    """Milliseconds from an `op.done` reaching the bench to the row's new status on the page."""
    nc = await nats.connect(url)
    done: dict[str, float] = {}

    async def on_done(msg: Any) -> None:
        done[json.loads(msg.data)["operation/id"]] = time.perf_counter()

    await nc.subscribe("sensorium-os.*.op.done", cb=on_done)
    latencies = []
    try:
        for index in range(count):
            node = NODES[index % len(NODES)]
            headers = {"Authorization": f"Bearer {tokens[node]}"}
            body = json.dumps({"directive": scan("ble", 1)}).encode()
            op = json.loads(
                (await nc.request(f"sensorium-os.{node}.op.start", body, 10, headers=headers)).data
            )["op"]
            running = {"node": node, "status": "running"}
            while op not in rows((await client.get("/lab", params=running)).text) and op not in done:
                await asyncio.sleep(0.01)
            while op not in done:
                await asyncio.sleep(0.005)
            while op in rows((await client.get("/lab", params=running)).text):
                await asyncio.sleep(0.01)
            latencies.append((time.perf_counter() - done[op]) * 1000)
    finally:
        await nc.close()
    return latencies


async def measure(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Start everything, fill, measure, stop."""
    broker, url = nats_server(root)
    processes: list[subprocess.Popen[bytes]] = [broker]
    try:
        operators, callers = {}, {}
        for node in NODES:
            data_dir = root / f"node-{node}"
            operators[node] = add_principal(data_dir, "op", "operator")
            callers[node] = add_principal(data_dir, "alice", "caller", [make_grant(SCAN)])
            log = root / f"node-{node}.log"
            serve = ["serve", "--simulate", "--port", "0", "--data-dir", str(data_dir)]
            processes.append(spawn([*serve, "--nats", url, "--node", node], log))
            wait_serving(processes[-1], log, 60)
        started = time.monotonic()
        await asyncio.gather(*(fill(url, node, callers[node], args.operations) for node in NODES))
        fill_seconds = time.monotonic() - started
        lab_dir = root / "lab"
        lab_token = add_principal(lab_dir, "bench", "operator")
        nodes_file = root / "nodes.json"
        nodes_file.write_text(json.dumps(operators))
        nodes_file.chmod(0o600)
        log = root / "lab.log"
        argv = ["lab", "--nats", url, "--nodes", str(nodes_file), "--data-dir", str(lab_dir), "--port", "0"]
        processes.append(spawn(argv, log))
        base = None
        while base is None:
            found = _LAB_URL.search(log.read_text())
            base = found.group(1) if found else None
            await asyncio.sleep(0.05)
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            await sign_in(client, lab_token)
            await wait_listed(client, len(NODES) * args.operations)
            pages = await page_latencies(client, args.pages)
            dones = await done_latencies(url, client, callers, args.samples)
        return {
            "operations_per_node": args.operations,
            "fill_seconds": round(fill_seconds, 1),
            "page_ms": {"p50": round(sorted(pages)[len(pages) // 2], 1), "p95": round(p95(pages), 1)},
            "page_target_ms": PAGE_TARGET_MS,
            "done_to_row_ms": {"p50": round(sorted(dones)[len(dones) // 2], 1), "p95": round(p95(dones), 1)},
            "done_to_row_target_ms": DONE_TARGET_MS,
        }
    finally:
        for process in reversed(processes):
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def main() -> int:
    """Parse, run, print one JSON document; exit 1 when a target is missed."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--operations", type=int, default=1000, help="retained operations per node")
    parser.add_argument("--pages", type=int, default=50, help="full page reads")
    parser.add_argument("--samples", type=int, default=20, help="op.done-to-row samples")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lab-bench-") as tmp:
        result = asyncio.run(measure(Path(tmp), args))
    print(json.dumps(result, indent=2))
    met = result["page_ms"]["p95"] <= PAGE_TARGET_MS and result["done_to_row_ms"]["p95"] <= DONE_TARGET_MS
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
