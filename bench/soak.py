"""Soak benchmark: many one-second replay scans against one real `serve`; what outlives a result stays flat.

A test catalog (the shipped one with `result_retention_seconds` set by `--retention`, signed here with a
fresh key) makes results go after a few seconds, so the figures show what outlives a result (durable
metadata, books, tasks), not the results kept on purpose. `--in-flight` workers each admit a 1 s BLE
replay scan on `POST /v1/directives` (rotating `--principals` callers, so the per-principal limit of 16 never
refuses), poll its status until it is terminal, and start the next one, until `--operations` were admitted.
After every `--block` operations the server's RSS (`VmRSS` of the process) is read; per block the
admission and status latencies are kept. At the end: RSS at the last block against the first, and
admission/status p99 of the last block against the first.

Usage (from the repo root):
`.venv/bin/python bench/soak.py [--operations 30000] [--in-flight 48] [--retention 3] [--block 5000]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

import httpx  # noqa: E402

from connector.catalog.keys import generate_key_pair, load_private_key  # noqa: E402
from connector.catalog.signing import sign_catalog  # noqa: E402
from connector.core.authority import make_grant  # noqa: E402
from connector.storage.principals import add_principal  # noqa: E402
from connector.testing import wait_serving  # noqa: E402

SCAN = "device.discovery.scan"
HEART_RATE = "0000180d-0000-1000-8000-00805f9b34fb"
TERMINAL = frozenset({"completed", "failed", "timed-out", "cancelled", "expired", "unknown"})
RSS_TARGET = 1.15
P99_TARGET = 2.0


def signed_catalog(directory: Path, result_retention_seconds: int) -> tuple[Path, Path]:
    """The shipped catalog with a short result retention, signed by a fresh key: (catalog, trust dir)."""
    document: dict[str, Any] = json.loads((ROOT / "catalog" / "actions.json").read_text(encoding="utf-8"))
    for action in document["actions"]:
        if action.get("class") == "discovery":
            action["discovery"]["result_retention_seconds"] = result_retention_seconds
    key_id = generate_key_pair(directory / "keys")
    trust = directory / "trust"
    trust.mkdir(parents=True)
    (trust / f"{key_id}.pub").write_bytes((directory / "keys" / f"{key_id}.pub").read_bytes())
    catalog = directory / "actions.json"
    catalog.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    signature = sign_catalog(document, load_private_key(directory / "keys" / f"{key_id}.key"))
    catalog.with_name("actions.json.sig").write_text(json.dumps(signature) + "\n", encoding="utf-8")
    return catalog, trust


def write_fixture(path: Path, devices: int = 8, seconds: int = 3) -> None:
    """A few heart-rate devices advertising from the start (each scan sees them within its 1 s window)."""
    header = {
        "fixture": "sensorium-hw-fixture.v1",
        "transport": "ble",
        "source": "synthesised",
        "recorded_at": "2026-12-01T00:00:00Z",
        "adapter": "hci0",
        "versions": {"generator": "bench/soak.py", "format": 1},
        "notes": "Synthesised for bench/soak.py.",
    }
    lines = [json.dumps(header)]
    for tick in range(seconds * 4):
        for device in range(devices):
            line = {
                "t_ms": tick * 250 + device,
                "address": f"02:00:00:00:01:{device:02X}",
                "rssi": -60 - (tick + device) % 5,
                "name": f"soak-{device}",
                "service_uuids": [HEART_RATE],
            }
            lines.append(json.dumps(line))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def scan_directive() -> dict[str, Any]:
    return {
        "schema": "sensorium-directive.v1",
        "action_id": SCAN,
        "timing": {"mode": "async", "status_versions": [2]},
        "input": {"transport": "ble", "window_seconds": 1, "filters": {"service_uuids": [HEART_RATE]}},
    }


def rss_kib(pid: int) -> int:
    """Resident set size of a process, in KiB (`VmRSS`)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, in milliseconds."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))] * 1000


@dataclass
class Block:
    """What one block of operations measured."""

    admit: list[float] = field(default_factory=list)
    status: list[float] = field(default_factory=list)
    failures: int = 0
    rss_kib: int = 0
    finished_at: float = 0.0


async def start_serve(
    argv: list[str], log: Path, timeout: float = 60.0
) -> tuple[subprocess.Popen[bytes], str]:
    """Spawn `serve` with a fresh log and wait, as `connector.testing` does, until it answers /healthz."""
    with log.open("wb") as sink:  # a fresh log: its `serving on` line is this server's
        process = subprocess.Popen(
            argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=sink
        )
    try:
        return process, await asyncio.to_thread(wait_serving, process, log, timeout)
    except RuntimeError as error:
        process.kill()
        raise SystemExit(f"{error}") from None


async def request(method: Any, path: str, **kwargs: Any) -> httpx.Response:
    """One request; a kept-alive connection the server closed meanwhile is retried once on a new one."""
    try:
        response: httpx.Response = await method(path, **kwargs)
    except httpx.TransportError:
        RETRIES[0] += 1
        response = await method(path, **kwargs)
    return response


RETRIES = [0]


async def soak(args: argparse.Namespace, url: str, pid: int, tokens: list[str]) -> list[Block]:
    """Run the workers; sample RSS at each block boundary (by admitted count, once its scans ended)."""
    blocks = [Block() for _ in range((args.operations + args.block - 1) // args.block)]
    admitted = 0
    ended = [0] * len(blocks)
    # Idle connections close before uvicorn's 5 s keep-alive timeout would close them under a request.
    limits = httpx.Limits(
        max_connections=args.in_flight, max_keepalive_connections=args.in_flight, keepalive_expiry=2.0
    )
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0) as client:

        async def one(number: int) -> None:
            block = blocks[number // args.block]
            headers = {"Authorization": f"Bearer {tokens[number % len(tokens)]}"}
            started = time.perf_counter()
            answer = await request(client.post, "/v1/directives", json=scan_directive(), headers=headers)
            block.admit.append(time.perf_counter() - started)
            if answer.status_code != 202:
                block.failures += 1
                return
            location = answer.headers["location"]
            await asyncio.sleep(1.0)
            while True:
                started = time.perf_counter()
                status = await request(client.get, location, headers=headers)
                block.status.append(time.perf_counter() - started)
                if status.status_code != 200:
                    block.failures += 1
                    return
                if status.json()["status"] in TERMINAL:
                    return
                await asyncio.sleep(0.25)

        async def worker() -> None:
            nonlocal admitted
            while admitted < args.operations:
                number = admitted
                admitted += 1
                await one(number)
                index = number // args.block
                ended[index] += 1
                if ended[index] == min(args.block, args.operations - index * args.block):
                    blocks[index].rss_kib = rss_kib(pid)
                    blocks[index].finished_at = time.monotonic()
                    done = (index + 1) * args.block
                    print(f"  {done:>6} operations: RSS {blocks[index].rss_kib / 1024:.1f} MiB", flush=True)

        await asyncio.gather(*(worker() for _ in range(args.in_flight)))
    return blocks


def report(args: argparse.Namespace, blocks: list[Block], settled_kib: int, seconds: float) -> None:
    print(f"\nmachine: {platform.machine()} {os.cpu_count()} CPU, Python {platform.python_version()}")
    print(
        f"{args.operations} operations, {args.in_flight} in flight, result retention {args.retention} s, "
        f"{seconds:.0f} s ({args.operations / seconds:.1f} scans/s)\n"
    )
    print(
        f"{'block':>6} {'RSS MiB':>8} {'admit p50':>9} {'admit p99':>9} {'status p50':>10}"
        f" {'status p99':>10} {'failed':>6}"
    )
    for index, block in enumerate(blocks):
        print(
            f"{(index + 1) * args.block:>6} {block.rss_kib / 1024:>8.1f} {percentile(block.admit, 50):>9.2f}"
            f" {percentile(block.admit, 99):>9.2f} {percentile(block.status, 50):>10.2f}"
            f" {percentile(block.status, 99):>10.2f} {block.failures:>6}"
        )
    first, last = blocks[0], blocks[-1]
    rss = last.rss_kib / first.rss_kib
    admit = percentile(last.admit, 99) / percentile(first.admit, 99)
    status = percentile(last.status, 99) / percentile(first.status, 99)
    print(f"\nconnection retries: {RETRIES[0]}")
    print(f"RSS after the results' retention: {settled_kib / 1024:.1f} MiB")
    print(f"RSS last block / first block: {rss:.3f} (target <= {RSS_TARGET})")
    print(f"admission p99 last / first: {admit:.2f} (target <= {P99_TARGET})")
    print(f"status p99 last / first: {status:.2f} (target <= {P99_TARGET})")
    met = rss <= RSS_TARGET and admit <= P99_TARGET and status <= P99_TARGET
    print("within targets" if met else "over target")


async def main(args: argparse.Namespace) -> int:
    print("command:", shlex.join([".venv/bin/python", "bench/soak.py", *sys.argv[1:]]))
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as temp:
        base = Path(temp)
        catalog, trust = signed_catalog(base / "catalog", args.retention)
        fixture = base / "soak.jsonl"
        write_fixture(fixture)
        data = base / "data"
        tokens = [
            add_principal(data, f"soak-{i}", "caller", [make_grant(SCAN)]) for i in range(args.principals)
        ]
        argv = [sys.executable, "-m", "connector", "serve", "--data-dir", str(data), "--port", "0"]
        argv += ["--catalog", str(catalog), "--trust", str(trust), "--replay", f"ble={fixture}"]
        log = Path(args.log) if args.log else base / "serve.log"
        process, url = await start_serve(argv, log)
        try:
            started = time.monotonic()
            try:
                blocks = await soak(args, url, process.pid, tokens)
            except httpx.TransportError:
                print(f"serve exit code: {process.poll()}; its log:", log.read_text(errors="replace")[-3000:])
                raise
            seconds = time.monotonic() - started
            await asyncio.sleep(args.retention + 2)
            settled = rss_kib(process.pid)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
        report(args, blocks, settled, seconds)
    return 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operations", type=int, default=30_000)
    parser.add_argument("--in-flight", type=int, default=48)
    parser.add_argument("--retention", type=int, default=3, help="result_retention_seconds of the catalog")
    parser.add_argument("--block", type=int, default=5_000)
    parser.add_argument("--principals", type=int, default=8, help="callers the scans rotate through")
    parser.add_argument("--log", default="", help="where the server's log goes (default: the temp dir)")
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
