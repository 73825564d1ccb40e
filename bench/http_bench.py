"""HTTP benchmark: one real `serve` process on loopback, driven by an async load client in the same run.

Phases, each with `--workers` concurrent httpx.AsyncClient workers on kept-alive connections, bounded by
`--requests` and `--seconds` (whichever comes first), after `--warmup` unmeasured requests:

- `healthz`: `GET /healthz`, the no-op reference;
- `admit`: `POST /v1/directives` admitting BLE replay scans (1 s windows). The replay provider declares
  concurrent sessions, so no claim refuses; principals rotate (`--principals`) so that the per-principal
  limit of 16 live operations never refuses either, and `--host-policy` lifts the live-session cap of 64 per
  transport to what those principals may hold. The scans' filter matches nothing in the fixture: the
  figure is the admission path, not ingest (that has `bench/ingest.py`). Any non-202 answer is counted as
  failed;
- `status`: `GET /v1/operations/{id}` of one running scan whose snapshot holds 64 candidates (every answer
  is checked to carry them);
- `wake`: sequential long polls `?wait_seconds=10&after_revision=R` on that scan, whose fixture changes
  every device's RSSI once a second: the latency is the time from the revision's `updated_at` (the cut) to
  the answer reaching the client (same host, same wall clock).

The fixture (64 heart-rate devices, then one RSSI change of all of them per second) and the principals are
written to a temporary data dir. Usage (from the repo root):
`.venv/bin/python bench/http_bench.py [--workers 8] [--requests 3000] [--seconds 15] [--principals 64]`.

`--retained N` first leaves N ended operations behind: `--prefill-http` of them (default 1,000) are real
scans admitted over HTTP and waited out until their results were erased; the rest are copies of one of
their durable rows (fresh random ids, rotating owners) inserted straight into the connector's state file in
large transactions, so that `--retained 100000` takes seconds rather than the half hour its admissions
would. `--profile PHASE` runs py-spy on the server during that phase (`--profile-out`: an SVG flame graph,
or collapsed stacks when the name ends in `.txt`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import os
import platform
import secrets
import shlex
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this file's folder comes first on sys.path, and this file's name would shadow the
# standard library's `http` package that httpx imports.
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

import httpx  # noqa: E402

from connector.core.authority import make_grant  # noqa: E402
from connector.core.ids import OPERATION_KIND, random_operation_id  # noqa: E402
from connector.storage.principals import add_principal  # noqa: E402
from connector.storage.state import STATE_RELATIVE_PATH  # noqa: E402
from connector.testing import wait_serving  # noqa: E402

SCAN = "device.discovery.scan"
HEART_RATE = "0000180d-0000-1000-8000-00805f9b34fb"
NOTHING = "0000feed-0000-1000-8000-00805f9b34fb"  # in no fixture line: admitted scans ingest nothing
DEVICES = 64
# Ratios to healthz that each route must stay within (issue 17: admission at the price of its fsync).
TARGETS = {
    "admit": {"p50": 2.0, "p99": 3.0, "throughput": 2.0},
    "status": {"p50": 2.0, "p99": 2.0, "throughput": 1.5},
}
SEED_BATCH = 10_000


@dataclass
class Phase:
    """What one phase measured."""

    name: str
    latencies: list[float] = field(default_factory=list)
    elapsed: float = 0.0
    failures: int = 0
    server_cpu: float = 0.0  # seconds of the server's CPU (all its threads) over the measured part

    @property
    def count(self) -> int:
        """Measured requests."""
        return len(self.latencies)

    @property
    def cpu_per_request_ms(self) -> float:
        """The server's CPU per measured request, in milliseconds."""
        return self.server_cpu / self.count * 1000 if self.count else 0.0

    @property
    def throughput(self) -> float:
        """Requests per second over the measured part."""
        return self.count / self.elapsed if self.elapsed else 0.0

    def percentile(self, q: float) -> float:
        """Latency percentile in milliseconds (nearest rank)."""
        ordered = sorted(self.latencies)
        index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
        return ordered[index] * 1000


def write_fixture(path: Path, seconds: int = 60) -> None:
    """64 heart-rate devices at once, then every second each of them again with another RSSI."""
    header = {
        "fixture": "sensorium-hw-fixture.v1",
        "transport": "ble",
        "source": "synthesised",
        "recorded_at": "2026-11-30T00:00:00Z",
        "adapter": "hci0",
        "versions": {"generator": "bench/http_bench.py", "format": 1},
        "notes": "Synthesised for bench/http_bench.py: 64 heart-rate devices, all RSSIs change every second.",
    }
    lines = [json.dumps(header)]
    for tick in range(seconds):
        for device in range(DEVICES):
            observation = {
                "t_ms": tick * 1000 + 5,
                "address": f"02:00:00:00:{device // 256:02X}:{device % 256:02X}",
                "rssi": -60 - (tick + device) % 7,
                "name": f"bench-{device:02d}",
                "service_uuids": [HEART_RATE],
                "connectable": True,
            }
            lines.append(json.dumps(observation))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def scan(window: int, uuid: str) -> dict[str, Any]:
    """A BLE discovery directive."""
    return {
        "schema": "sensorium-directive.v1",
        "action_id": SCAN,
        "timing": {"mode": "async", "status_versions": [2]},
        "input": {"transport": "ble", "window_seconds": window, "filters": {"service_uuids": [uuid]}},
    }


def candidates(status: dict[str, Any]) -> list[Any]:
    """The candidates of a running status's snapshot."""
    return list(((status.get("progress") or {}).get("snapshot") or {}).get("candidates") or [])


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


async def run_phase(
    name: str,
    request: Callable[[httpx.AsyncClient, int], Awaitable[bool]],
    *,
    base_url: str,
    workers: int,
    requests: int,
    seconds: float,
    warmup: int,
    cpu: Callable[[], float] = lambda: 0.0,
) -> Phase:
    """`workers` clients issue `request` until `requests` were measured or `seconds` passed."""
    phase = Phase(name)
    # One kept-alive connection per worker (as wrk and hey drive a server): requests never queue in a
    # shared pool inside the load client, which made a request wait there for up to 1.4 s before it was
    # sent while the server answered each status poll in about a millisecond.
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(httpx.AsyncClient(base_url=base_url, limits=limits, timeout=30.0))
            for _ in range(workers)
        ]
        issued = 0

        async def worker(client: httpx.AsyncClient, measure: bool, budget: int, until: float) -> None:
            nonlocal issued
            while issued < budget and time.monotonic() < until:
                number = issued
                issued += 1
                started = time.perf_counter()
                ok = await request(client, number)
                if measure:
                    phase.latencies.append(time.perf_counter() - started)
                    phase.failures += 0 if ok else 1

        warmup_until = time.monotonic() + seconds
        await asyncio.gather(*(worker(client, False, warmup, warmup_until) for client in clients))
        issued = 0
        # The load client's own collector pauses would land on whichever phase runs: none while measuring.
        gc.collect()
        gc.disable()
        try:
            started, cpu_before = time.monotonic(), cpu()
            await asyncio.gather(*(worker(client, True, requests, started + seconds) for client in clients))
            phase.elapsed = time.monotonic() - started
            phase.server_cpu = cpu() - cpu_before
        finally:
            gc.enable()
    return phase


async def measure_wake(base_url: str, location: str, headers: dict[str, str], samples: int) -> list[float]:
    """Seconds from each revision's cut (`updated_at`) to the long poll's answer reaching the client."""
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30.0) as client:
        current = (await client.get(location)).json()
        for _ in range(samples):
            revision = current["progress"]["revision"]
            answer = await client.get(location, params={"wait_seconds": 10, "after_revision": revision})
            received = time.time()
            current = answer.json()
            if current.get("status") != "running" or current["progress"]["revision"] <= revision:
                break
            cut = datetime.fromisoformat(current["updated_at"].replace("Z", "+00:00")).timestamp()
            latencies.append(received - cut)
    return latencies


async def main(args: argparse.Namespace) -> int:
    """Set up, start `serve`, run the phases, print the figures."""
    print("command:", shlex.join([".venv/bin/python", "bench/http_bench.py", *sys.argv[1:]]))
    with tempfile.TemporaryDirectory(prefix="bench-http-") as temp:
        base = Path(temp)
        fixture = base / "bench-64.jsonl"
        write_fixture(fixture)
        data = base / "data"
        grant = [make_grant(SCAN)]
        tokens = [add_principal(data, f"load-{i}", "caller", grant) for i in range(args.principals)]
        poller = add_principal(data, "poller", "caller", grant)
        argv = [
            sys.executable,
            "-m",
            "connector",
            "serve",
            "--data-dir",
            str(data),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--replay",
            f"ble={fixture}",
            "--allow-test-key",  # the shipped example catalog and its test key
            "--host-policy",
            str(_bench_policy(base, args.principals)),
        ]
        if args.retained:
            argv += _short_retention_catalog(base, args.result_retention)
        print("serve:  ", shlex.join(argv))
        process, url = await start_serve(argv, base / "serve.log")
        try:
            phases = await run_all(args, url, tokens, poller, Server(process.pid, data))
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
        report(args, *phases)
    return 0


@dataclass(frozen=True)
class Server:
    """The `serve` process under test: its pid (for py-spy) and its data dir (for seeding)."""

    pid: int
    data: Path

    def cpu_seconds(self) -> float:
        """User + system CPU of the process so far (every thread), from /proc."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@asynccontextmanager
async def profiling(args: argparse.Namespace, phase: str, server: Server) -> AsyncIterator[None]:
    """py-spy records the server while the body runs, when `--profile` names this phase."""
    if args.profile != phase:
        yield
        return
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        raise SystemExit("--profile needs py-spy (pip install py-spy, the bench extra)")
    # The SVG names the command line (machine paths): kept out of the checkout unless asked for.
    out = Path(args.profile_out or Path(tempfile.gettempdir()) / f"http-bench-{phase}.svg").resolve()
    kind = "raw" if out.suffix == ".txt" else "flamegraph"
    argv = [spy, "record", "--pid", str(server.pid), "--rate", "200", "-f", kind, "-o", str(out)]
    argv += ["--gil"] if args.profile_gil else []
    recorder = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    await asyncio.sleep(1.0)  # py-spy attaches before the measured requests start
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)
        _, errors = await asyncio.to_thread(recorder.communicate)
        print(f"profile of {phase}: {out} (py-spy exit {recorder.returncode})")
        if recorder.returncode:
            print(errors.decode(errors="replace")[-2000:])


async def run_all(
    args: argparse.Namespace, url: str, tokens: list[str], poller: str, server: Server
) -> tuple[list[Phase], list[float]]:
    """The four phases in order."""
    bounds: dict[str, Any] = {
        "base_url": url,
        "workers": args.workers,
        "requests": args.requests,
        "seconds": args.seconds,
        "cpu": server.cpu_seconds,
    }

    async def healthz(client: httpx.AsyncClient, _: int) -> bool:
        return (await client.get("/healthz")).status_code == 200

    async def admit(client: httpx.AsyncClient, number: int) -> bool:
        headers = {"Authorization": f"Bearer {tokens[number % len(tokens)]}"}
        answer = await client.post("/v1/directives", json=scan(1, NOTHING), headers=headers)
        return answer.status_code == 202

    if args.retained:
        await prefill(url, tokens, args)
        seed_retained(server.data, args.retained - min(args.retained, max(1, args.prefill_http)), tokens)
    async with profiling(args, "healthz", server):
        noop = await run_phase("healthz", healthz, warmup=args.warmup, **bounds)
    async with profiling(args, "admit", server):
        admitted = await run_phase("admit", admit, warmup=args.warmup, **bounds)
    await asyncio.sleep(2.5)  # let the admitted 1 s scans end before the next phase
    auth = {"Authorization": f"Bearer {poller}"}
    async with httpx.AsyncClient(base_url=url, headers=auth, timeout=30.0) as client:
        accepted = await client.post("/v1/directives", json=scan(60, HEART_RATE))
        location = accepted.headers["location"]
        while len(candidates((await client.get(location)).json())) < DEVICES:
            await asyncio.sleep(0.1)

    async def status(client: httpx.AsyncClient, _: int) -> bool:
        answer = await client.get(location, headers=auth)
        return answer.status_code == 200 and len(candidates(answer.json())) == DEVICES

    async with profiling(args, "status", server):
        polled = await run_phase(
            "status", status, warmup=args.warmup, **{**bounds, "seconds": min(args.seconds, 20)}
        )
    wake = await measure_wake(url, location, auth, args.wake_samples)
    return [noop, admitted, polled], wake


def _bench_policy(base: Path, principals: int) -> Path:
    """A host policy whose live-session cap (64 per transport by default) admits every principal's 16: the
    admit phase measures admission, not the 429 of a cap (replay sessions are no worker processes)."""
    path = base / "host-policy.json"
    path.write_text(json.dumps({"max_live_sessions": 16 * (principals + 1)}))
    return path


def _short_retention_catalog(base: Path, retention: int) -> list[str]:
    """`--catalog`/`--trust` of the shipped catalog with a short result retention (bench/soak.py's)."""
    spec = importlib.util.spec_from_file_location("bench_soak", ROOT / "bench" / "soak.py")
    assert spec is not None and spec.loader is not None
    soak = importlib.util.module_from_spec(spec)
    sys.modules["bench_soak"] = soak  # dataclasses look their module up there
    spec.loader.exec_module(soak)
    catalog, trust = soak.signed_catalog(base / "catalog", retention)
    return ["--catalog", str(catalog), "--trust", str(trust)]


async def prefill(url: str, tokens: list[str], args: argparse.Namespace) -> None:
    """Admit `--prefill-http` 1 s scans first (unmeasured); wait until their results were erased."""
    started = time.monotonic()
    issued = 0
    count = min(args.retained, max(1, args.prefill_http))
    limits = httpx.Limits(
        max_connections=args.workers, max_keepalive_connections=args.workers, keepalive_expiry=2.0
    )
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0) as client:

        async def worker() -> None:
            nonlocal issued
            while issued < count:
                number = issued
                issued += 1
                headers = {"Authorization": f"Bearer {tokens[number % len(tokens)]}"}
                while (
                    await client.post("/v1/directives", json=scan(1, NOTHING), headers=headers)
                ).status_code == 429:
                    await asyncio.sleep(0.2)

        await asyncio.gather(*(worker() for _ in range(args.workers)))
    await asyncio.sleep(args.result_retention + 3)
    print(f"prefill: {count} operations admitted over HTTP and ended in {time.monotonic() - started:.0f} s")


def seed_retained(data: Path, count: int, tokens: list[str]) -> None:
    """`count` more ended operations: copies of an erased durable row, inserted in large transactions.

    The server keeps running meanwhile (WAL: its reads go on, its writes wait for each transaction).
    """
    if count <= 0:
        return
    started = time.monotonic()
    with sqlite3.connect(data / STATE_RELATIVE_PATH, timeout=30.0) as db:
        db.execute("PRAGMA synchronous=FULL")
        cursor = db.execute(
            "SELECT * FROM discovery_operations WHERE metadata_json LIKE '%\"erased_at\"%' LIMIT 1"
        )
        template = cursor.fetchone()
        if template is None:
            raise SystemExit("seeding: no erased operation to copy (the prefill left none)")
        columns = [entry[0] for entry in cursor.description]
        marks = ", ".join("?" * len(columns))
        statement = f"INSERT INTO discovery_operations ({', '.join(columns)}) VALUES ({marks})"
        for first in range(0, count, SEED_BATCH):
            rows = [
                _copy_row(template, columns, f"load-{number % len(tokens)}")
                for number in range(first, min(count, first + SEED_BATCH))
            ]
            with db:
                db.executemany(statement, rows)
    seconds = time.monotonic() - started
    print(f"seeded: {count} ended operations copied into the state file in {seconds:.1f} s")


def _copy_row(template: tuple[Any, ...], columns: list[str], owner: str) -> tuple[Any, ...]:
    """The template row under a fresh operation id and another owner (every text column rewritten)."""
    old_id = template[columns.index("operation_id")]
    old_owner = template[columns.index("owner")]
    new_id = random_operation_id(OPERATION_KIND, secrets.token_bytes(16))
    quoted, requoted = f'"{old_owner}"', f'"{owner}"'
    row = [
        value.replace(old_id, new_id).replace(quoted, requoted) if isinstance(value, str) else value
        for value in template
    ]
    row[columns.index("owner")] = owner
    return tuple(row)


def report(args: argparse.Namespace, phases: list[Phase], wake: list[float]) -> None:
    """The table, the ratios against the no-op route, and the long-poll wake-up latency."""
    print(f"machine: {platform.machine()} {os.cpu_count()} CPU, Python {platform.python_version()}")
    print(f"workers {args.workers}, up to {args.requests} requests or {args.seconds} s per phase\n")
    noop = phases[0]
    print(
        f"{'route':<10} {'requests':>8} {'failed':>6} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8}"
        f" {'p50 x':>6} {'p99 x':>6} {'thr x':>6} {'cpu ms':>7} {'cpu x':>6}"
    )
    for phase in phases:
        p50, p99 = phase.percentile(50), phase.percentile(99)
        shown = (p50 / noop.percentile(50), p99 / noop.percentile(99), noop.throughput / phase.throughput)
        cpu = phase.cpu_per_request_ms
        cpu_x = cpu / noop.cpu_per_request_ms if noop.cpu_per_request_ms else 0.0
        print(
            f"{phase.name:<10} {phase.count:>8} {phase.failures:>6} {p50:>8.2f} {p99:>8.2f}"
            f" {phase.throughput:>8.0f} {shown[0]:>6.2f} {shown[1]:>6.2f} {shown[2]:>6.2f}"
            f" {cpu:>7.2f} {cpu_x:>6.2f}"
        )
    print(
        "\n(x = ratio to healthz: latency / healthz latency, healthz req/s / route req/s, server CPU per"
        " request / healthz's)"
    )
    for phase in phases[1:]:
        ratios = {
            "p50": phase.percentile(50) / noop.percentile(50),
            "p99": phase.percentile(99) / noop.percentile(99),
            "throughput": noop.throughput / phase.throughput,
        }
        limits = TARGETS[phase.name]
        missed = [f"{name} {x:.2f}x > {limits[name]}x" for name, x in ratios.items() if x > limits[name]]
        met = ", ".join(f"{name} <= {limit}x" for name, limit in limits.items())
        verdict = f"within target ({met})" if not missed else "over target: " + ", ".join(missed)
        print(f"{phase.name}: {verdict}")
    if wake:
        ms = sorted(w * 1000 for w in wake)
        print(
            f"long-poll wake-up after a new revision: n={len(ms)} median {statistics.median(ms):.1f} ms,"
            f" max {ms[-1]:.1f} ms"
        )
    else:
        print("long-poll wake-up: no sample (the scan ended or no revision came)")


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument(
        "--requests", type=int, default=3000, help="measured requests per phase (upper bound)"
    )
    parser.add_argument("--seconds", type=float, default=15.0, help="time bound per phase")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--principals", type=int, default=64, help="callers the admissions rotate through")
    parser.add_argument("--wake-samples", type=int, default=10)
    parser.add_argument(
        "--retained", type=int, default=0, help="operations admitted (and ended) before the measured phases"
    )
    parser.add_argument(
        "--prefill-http",
        type=int,
        default=1000,
        help="with --retained: how many of them are admitted over HTTP (the rest are seeded in the store)",
    )
    parser.add_argument(
        "--result-retention", type=int, default=3, help="with --retained: the catalog's result retention"
    )
    parser.add_argument("--profile", choices=("healthz", "admit", "status"), help="py-spy this phase")
    parser.add_argument("--profile-out", help="with --profile: output (.svg flame graph, .txt collapsed)")
    parser.add_argument(
        "--profile-gil", action="store_true", help="with --profile: only samples holding the GIL (CPU)"
    )
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
