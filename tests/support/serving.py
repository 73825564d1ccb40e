"""Real `sensorium-connector` processes: `serve` on 127.0.0.1, an OS-chosen port, logs in files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx

from connector.testing import wait_serving
from tests.support.paths import REPO


def cli_env(token: str | None = None) -> dict[str, str]:
    """The test interpreter's environment with the repository importable, unbuffered and without colours.

    `SENSORIUM_TOKEN` is the given token, or unset.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("FORCE_COLOR", None)
    env.pop("SENSORIUM_TOKEN", None)
    if token is not None:
        env["SENSORIUM_TOKEN"] = token
    return env


def cli_argv(*args: str | Path) -> list[str]:
    """`python -m connector ARGS`."""
    return [sys.executable, "-m", "connector", *map(str, args)]


def serve_argv(*args: str | Path) -> list[str]:
    """`serve` on 127.0.0.1 with an OS-chosen port, trusting the example's test key, then `args`."""
    return cli_argv("serve", "--host", "127.0.0.1", "--port", "0", "--allow-test-key", *args)


def spawn(argv: Sequence[str], log: Path, *, stdout: Path | None = None) -> subprocess.Popen[bytes]:
    """Start a process in the repository root, its stderr appended to `log` (stdout to `stdout`, if given)."""
    with log.open("ab") as err, (stdout.open("ab") if stdout else open(os.devnull, "wb")) as out:
        return subprocess.Popen(
            list(argv), cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=cli_env()
        )


@dataclass(slots=True)
class ServeProcess:
    """One running `serve` with its base URL and its log file (stderr)."""

    process: subprocess.Popen[bytes]
    base_url: str
    log: Path

    def client(self, token: str | None = None, timeout: float = 10.0) -> httpx.Client:
        """An HTTP client for this server, optionally with a bearer token."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def log_text(self) -> str:
        """Everything the process logged so far."""
        return self.log.read_text(encoding="utf-8", errors="replace")

    def kill9(self) -> None:
        """SIGKILL: no shutdown code of the server runs."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 20.0) -> int:
        """Send `sig` (if still running) and wait for the exit code; SIGKILL and raise after `timeout`."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
            raise

    async def stop_async(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 20.0) -> int:
        """`stop` without blocking the event loop."""
        return await anyio.to_thread.run_sync(self.stop, sig, timeout)


def start_serve(
    *args: str | Path, log: Path, stdout: Path | None = None, timeout: float = 30.0
) -> ServeProcess:
    """Start `serve ARGS`; returns once it logged its URL and `/healthz` answers 200."""
    log.parent.mkdir(parents=True, exist_ok=True)
    process = spawn(serve_argv(*args), log, stdout=stdout)
    try:
        return ServeProcess(process, wait_serving(process, log, timeout), log)
    except BaseException:
        process.kill()
        process.wait(timeout=10)
        raise


@contextmanager
def serving(
    *args: str | Path, log: Path, stdout: Path | None = None, timeout: float = 30.0
) -> Iterator[ServeProcess]:
    """`start_serve` that always ends the process (SIGTERM, else SIGKILL)."""
    server = start_serve(*args, log=log, stdout=stdout, timeout=timeout)
    try:
        yield server
    finally:
        if server.process.poll() is None:
            server.stop()


@asynccontextmanager
async def serving_async(*args: str | Path, log: Path, timeout: float = 30.0) -> AsyncIterator[ServeProcess]:
    """`serving` for async tests: starting and stopping do not block the event loop."""
    server = await anyio.to_thread.run_sync(lambda: start_serve(*args, log=log, timeout=timeout))
    try:
        yield server
    finally:
        if server.process.poll() is None:
            await server.stop_async()


async def wait_exit(process: subprocess.Popen[bytes], timeout: float) -> int:
    """The exit code, waiting without blocking the event loop."""
    with anyio.fail_after(timeout):
        while process.poll() is None:
            await anyio.sleep(0.05)  # real peer: the serve process
    return process.returncode
