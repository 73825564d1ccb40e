"""`sensorium-connector ops ...` and `serve --nats` as real processes against a real broker."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.bus.broker import NatsServer
from tests.bus.processes import start_bus_serve
from tests.bus.support import FAIL, SLEEP, ble_scan, client, make_env, running_connector, spying
from tests.support.directives import command_directive
from tests.support.serving import cli_argv, cli_env
from tests.support.waiting import wait_until

pytestmark = pytest.mark.realtime  # every test runs the CLI, most against a nats-server and serve


async def run_cli(*args: str, token: str | None, timeout: float = 60.0) -> tuple[int, str, str]:
    """Run one command line; its exit code, stdout and stderr."""
    with anyio.fail_after(timeout):
        done = await anyio.run_process(cli_argv(*args), env=cli_env(token), check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.mark.parametrize(
    ("args", "token", "reason"),
    [
        (["ops", "watch", "job-1"], None, "no bearer token"),
        (["ops", "watch", "bad op"], "t", "OP must be"),
        (["ops", "watch", "job-1", "--nats", "http://127.0.0.1:1"], "t", "--nats takes a broker URL"),
        (["ops", "watch", "job-1", "--service", "a b"], "t", "service name"),
        (["ops", "watch", "job-1", "--poll", "0"], "t", "greater than 0"),
        (["ops", "start", "--directive", "/nonexistent.json"], "t", "--directive"),
        (["ops", "get", "job-1", "--token-file", "/nonexistent"], None, "--token-file"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args: list[str], token: str | None, reason: str) -> None:
    done = subprocess.run(cli_argv(*args), env=cli_env(token), capture_output=True, timeout=60, check=False)
    stderr = done.stderr.decode()
    assert done.returncode == 2 and reason in stderr and len(stderr.strip().splitlines()) == 1


def test_an_unreachable_broker_exits_2() -> None:
    url = f"nats://127.0.0.1:{_free_port()}"
    args = ["ops", "watch", "job-1", "--nats", url, "--connect-timeout", "0.5"]
    done = subprocess.run(cli_argv(*args), env=cli_env("t"), capture_output=True, timeout=60, check=False)
    assert done.returncode == 2 and "cannot reach the broker" in done.stderr.decode()


@pytest.mark.asyncio
async def test_watch_exits_with_the_terminal_state(tmp_path: Path, broker: NatsServer) -> None:
    env = make_env(tmp_path)
    token = env.tokens["alice"]
    results: dict[str, tuple[int, str, str]] = {}
    nats = ["--nats", broker.url, "--poll", "0.3"]

    async def watch(op: str, *extra: str) -> None:
        results[op] = await run_cli("ops", "watch", op, *nats, *extra, token=token)

    async with (
        spying(broker.url) as spy,
        running_connector(env, broker.url),
        client(broker.url, token) as bus,
    ):
        async with anyio.create_task_group() as tg:
            # Interest registered before the work is submitted: the watchers start on `unknown`.
            tg.start_soon(watch, "cli-done")
            tg.start_soon(watch, "cli-cancelled", "--json")
            tg.start_soon(watch, "cli-failed")
            await wait_until(lambda: len(_asked(spy)) == 3, timeout=30)
            await bus.start(ble_scan(1), op="cli-done")
            await bus.start(command_directive(SLEEP), op="cli-cancelled")
            await bus.start(command_directive(FAIL), op="cli-failed")
            with anyio.fail_after(30):  # cancelled while it runs, not before it started
                while (await bus.get("cli-cancelled"))["state"] != "running":
                    await anyio.sleep(0.05)  # real peer: the command subprocess starts under serve
            assert (await bus.cancel("cli-cancelled"))["cancelled"] is True
        token_file = tmp_path / "token"
        token_file.write_text(token + "\n")
        by_file = await run_cli(
            "ops", "watch", "cli-done", *nats, "--token-file", str(token_file), token=None
        )
        refused = await run_cli("ops", "watch", "cli-done", *nats, token="not-a-token")
        got = await run_cli("ops", "get", "cli-failed", "--nats", broker.url, token=token)
        cancel = await run_cli("ops", "cancel", "cli-failed", "--nats", broker.url, token=token)
        directive_file = tmp_path / "directive.json"
        directive_file.write_text(json.dumps(ble_scan(1)))
        start_args = ["--directive", str(directive_file), "--op", "cli-start", "--nats", broker.url]
        start = await run_cli("ops", "start", *start_args, token=token)

    code, out, _ = results["cli-done"]
    assert code == 0 and out.splitlines()[0] == "unknown" and out.splitlines()[-1] == "done (window-complete)"
    code, out, _ = results["cli-cancelled"]
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 130 and lines[-1]["state"] == "cancelled" and lines[-1]["op"] == "cli-cancelled"
    code, out, _ = results["cli-failed"]
    assert code == 1 and out.splitlines()[-1] == "failed (command-failed)"
    assert by_file[0] == 0 and by_file[1].splitlines() == ["done (window-complete)"]
    assert refused[0] == 2 and "refused (unauthenticated)" in refused[2]
    assert got[0] == 0 and json.loads(got[1])["state"] == "failed"
    assert cancel[0] == 0 and json.loads(cancel[1]) == {
        "op": "cli-failed",
        "cancelled": False,
        "state": "failed",
    }
    assert start[0] == 0 and json.loads(start[1])["op"] == "cli-start"


def _asked(spy: Any) -> set[str]:
    """The handles some watcher asked `op.get` about."""
    return {json.loads(m.data)["op"] for m in spy.messages if m.subject == "sensorium-os.op.get"}


def _lines_until(process: subprocess.Popen[bytes], wanted: str, timeout: float = 30.0) -> list[str]:
    """Lines of the process's stdout up to and including `wanted` (AssertionError after `timeout`)."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while wanted not in seen:
        assert time.monotonic() < deadline, f"no {wanted!r} line in time: {seen}"
        line = process.stdout.readline()
        assert line, f"the process ended before a {wanted!r} line: {seen}"
        seen.append(line.decode().rstrip("\n"))
    return seen


def _lines(process: subprocess.Popen[bytes]) -> list[str]:
    assert process.stdout is not None
    with process.stdout:
        return process.stdout.read().decode().splitlines()


@pytest.mark.serve
@pytest.mark.asyncio
async def test_serve_killed_mid_scan_reports_lost_once_to_a_waiting_watcher(
    tmp_path: Path, broker: NatsServer
) -> None:
    env = make_env(tmp_path)
    token = env.tokens["alice"]
    first = await anyio.to_thread.run_sync(start_bus_serve, env, broker.url, "serve-1")
    watcher: subprocess.Popen[bytes] | None = None
    try:
        async with spying(broker.url) as spy, client(broker.url, token) as bus:
            assert (await bus.start(ble_scan(30), op="kill-1"))["state"] in ("queued", "running")
            argv = cli_argv("ops", "watch", "kill-1", "--nats", broker.url, "--poll", "0.5")
            watcher = subprocess.Popen(argv, env=cli_env(token), stdout=subprocess.PIPE)
            # The watcher is following the running scan once it said so (a loaded machine starts it late).
            seen = await anyio.to_thread.run_sync(_lines_until, watcher, "running")
            first.kill9()
            second = await anyio.to_thread.run_sync(start_bus_serve, env, broker.url, "serve-2")
            try:
                code = await anyio.to_thread.run_sync(lambda: watcher.wait(timeout=30))
                got = await bus.get("kill-1")
                await wait_until(lambda: spy.done("kill-1"), timeout=30)
                # A marker, not a pause: serve-2 answers a later request on the same connection, so any
                # second `lost` it published before has reached the spy once the spy holds that answer.
                answered = len(spy.replies())
                await bus.get("kill-1")
                await wait_until(lambda: len(spy.replies()) > answered, timeout=30)
            finally:
                await anyio.to_thread.run_sync(second.stop)
        lines = seen + _lines(watcher)
        assert code == 1 and lines[-1] == "lost (interrupted-by-restart)" and "running" in lines
        assert (got["state"], got["status"]) == ("lost", "failed")
        assert got["error_code"] == "interrupted-by-restart"
        [lost] = spy.done("kill-1")
        assert (lost["state"], lost["reason"]) == ("lost", "interrupted-by-restart")
        logs = first.log.read_bytes() + second.log.read_bytes()
        assert b"kill-1" not in logs and b"serving on" in logs
    finally:
        if first.process.poll() is None:
            first.stop()
        if watcher is not None and watcher.poll() is None:
            watcher.kill()
            watcher.wait(timeout=10)
        if watcher is not None and watcher.stdout is not None:
            watcher.stdout.close()
