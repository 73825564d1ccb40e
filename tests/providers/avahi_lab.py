"""A real mDNS responder for tests and benchmarks: avahi-daemon 0.8 in private network namespaces.

The recipe of the shared RECIPES.md section 2b: a network namespace of its own (nothing reaches the host's
NICs), a private `dbus-daemon` as avahi's system bus, `avahi-daemon` with a config of its own and its pid
file on a private tmpfs, services published with `avahi-publish-service` (SIGTERM sends the goodbye;
SIGKILL of the daemon makes the responder vanish without one). Two topologies:

- `lo`: one namespace, multicast on its loopback, avahi bound to `lo` (the recipe as written);
- `veth`: a responder namespace and a browser namespace joined by a veth pair, the browser's default routes
  (IPv4 and IPv6) through it, so the connector's *default* interface choice is exercised; `ipv6_only`
  gives the link no IPv4 at all and avahi `use-ipv4=no` (a Matter-like responder).

Every name carries this process's pid and a random suffix; `close()` stops what it started by pid and
deletes its namespaces.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

TOOLS = ("ip", "dbus-daemon", "avahi-daemon", "avahi-publish-service", "avahi-browse")


def unavailable_reason() -> str | None:
    """Why the lab cannot run here, or None."""
    if os.geteuid() != 0:
        return "avahi lab needs root (network namespaces); CI runs the tests as root"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return "avahi lab needs " + ", ".join(missing) + " (scripts/bootstrap.sh installs them as root)"
    return None


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=20)


def _wait_for_line(log: Path, needle: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and needle in log.read_text(errors="replace"):
            return
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited early: {log.read_text(errors='replace')[-400:]}")
        time.sleep(0.02)  # real peer: the lab's process writes its log
    raise RuntimeError(f"timed out waiting for {needle!r} in {log}")


@dataclass
class Publication:
    """One `avahi-publish-service` process."""

    name: str
    process: subprocess.Popen[bytes]


@dataclass
class _Responder:
    """A dbus-daemon + avahi-daemon pair serving one namespace."""

    namespace: str
    bus_address: str
    bus: subprocess.Popen[bytes]
    daemon: subprocess.Popen[bytes]


@dataclass
class AvahiLab:
    """Namespaces, buses and daemons of one lab; use `start()` and `close()` (or a fixture)."""

    workdir: Path
    topology: Literal["lo", "veth"] = "lo"
    ipv6_only: bool = False
    tag: str = field(default_factory=lambda: f"s11{os.getpid() % 10000}{secrets.token_hex(2)}")
    namespaces: list[str] = field(default_factory=list)
    _responders: list[_Responder] = field(default_factory=list)
    _publications: list[Publication] = field(default_factory=list)
    _links: list[str] = field(default_factory=list)

    # -- layout ------------------------------------------------------------------------------------------

    @property
    def responder_ns(self) -> str:
        """Where the published services live."""
        return self.namespaces[0]

    @property
    def browser_ns(self) -> str:
        """Where the connector (and avahi-browse) runs."""
        return self.namespaces[-1]

    @property
    def browser_link(self) -> str:
        """The browser namespace's interface towards the responder."""
        return "lo" if self.topology == "lo" else f"{self.tag}h"

    @property
    def pinned_interface(self) -> str:
        """The browser's address to pin `--mdns-interfaces` to (the recipe pins 127.0.0.1 on `lo`)."""
        return "127.0.0.1" if self.topology == "lo" else "10.211.0.1"

    def netns_exec(self, namespace: str) -> list[str]:
        """The command prefix that runs inside `namespace`."""
        return ["ip", "netns", "exec", namespace]

    def start(self) -> AvahiLab:
        """Build the namespaces and start the responder's avahi-daemon."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.topology == "lo":
            self._add_namespace(self.tag)
            ns = self.tag
            _run(*self.netns_exec(ns), "ip", "link", "set", "lo", "multicast", "on")
            _run(*self.netns_exec(ns), "ip", "route", "add", "224.0.0.0/4", "dev", "lo")
            self.start_responder(ns, "lo", ipv4=True, ipv6=False)
        else:
            self._build_veth()
            self.start_responder(self.responder_ns, f"{self.tag}d", ipv4=not self.ipv6_only, ipv6=True)
        return self

    def _add_namespace(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self.namespaces.append(name)
        _run(*self.netns_exec(name), "ip", "link", "set", "lo", "up")

    def _build_veth(self) -> None:
        dev_ns, host_ns = f"{self.tag}-dev", f"{self.tag}-host"
        self._add_namespace(dev_ns)
        self._add_namespace(host_ns)
        host_if, dev_if = f"{self.tag}h", f"{self.tag}d"
        _run("ip", "link", "add", host_if, "netns", host_ns, "type", "veth", "peer", "name", dev_if)
        _run("ip", "link", "set", dev_if, "netns", dev_ns)
        for ns, ifname, last in ((host_ns, host_if, 1), (dev_ns, dev_if, 2)):
            if not self.ipv6_only:
                _run(*self.netns_exec(ns), "ip", "addr", "add", f"10.211.0.{last}/24", "dev", ifname)
            ula = f"fd11:211::{last}/64"
            _run(*self.netns_exec(ns), "ip", "-6", "addr", "add", ula, "dev", ifname, "nodad")
            _run(*self.netns_exec(ns), "ip", "link", "set", ifname, "up")
        if not self.ipv6_only:
            _run(*self.netns_exec(host_ns), "ip", "route", "add", "default", "dev", host_if)
        _run(*self.netns_exec(host_ns), "ip", "-6", "route", "add", "default", "dev", host_if)
        self._wait_for_link_local(host_ns, host_if)
        self._wait_for_link_local(dev_ns, dev_if)

    def _wait_for_link_local(self, ns: str, ifname: str) -> None:
        """IPv6 multicast needs the link-local address out of duplicate address detection."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            shown = subprocess.run(
                [*self.netns_exec(ns), "ip", "-6", "addr", "show", "dev", ifname, "scope", "link"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            if "fe80::" in shown and "tentative" not in shown:
                return
            time.sleep(0.05)  # real peer: the kernel's duplicate address detection
        raise RuntimeError("link-local address stayed tentative")

    # -- daemons -----------------------------------------------------------------------------------------

    def start_responder(self, namespace: str, interface: str, *, ipv4: bool, ipv6: bool) -> str:
        """A private system bus and an avahi-daemon for `namespace`; returns the bus address."""
        index = len(self._responders)
        conf_dir = self.workdir / f"avahi-{index}"
        conf_dir.mkdir()
        bus_socket = conf_dir / "bus.sock"
        (conf_dir / "bus.conf").write_text(
            "<busconfig><type>system</type>"
            f"<listen>unix:path={bus_socket}</listen><auth>EXTERNAL</auth>"
            '<policy context="default"><allow user="*"/><allow own="*"/><allow send_destination="*"/>'
            '<allow receive_sender="*"/></policy></busconfig>\n'
        )
        bus = subprocess.Popen(
            ["dbus-daemon", f"--config-file={conf_dir / 'bus.conf'}", "--nofork"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        address = f"unix:path={bus_socket}"
        deadline = time.monotonic() + 5
        while not bus_socket.exists() and time.monotonic() < deadline:
            time.sleep(0.01)  # real peer: dbus-daemon creates its socket
        (conf_dir / "avahi.conf").write_text(
            "[server]\n"
            f"host-name={self.tag}r{index}\n"
            f"use-ipv4={'yes' if ipv4 else 'no'}\nuse-ipv6={'yes' if ipv6 else 'no'}\n"
            f"allow-interfaces={interface}\nenable-dbus=yes\n"
            "ratelimit-interval-usec=1000000\nratelimit-burst=1000\n"
            "[wide-area]\nenable-wide-area=no\n"
            "[publish]\npublish-hinfo=no\npublish-workstation=no\n"
        )
        log = conf_dir / "avahi.log"
        script = (
            "mkdir -p /run/avahi-daemon && mount -t tmpfs s11-avahi-run /run/avahi-daemon && "
            f"exec avahi-daemon -f {conf_dir / 'avahi.conf'} --no-chroot --no-drop-root --no-rlimits"
        )
        with log.open("wb") as sink:
            daemon = subprocess.Popen(
                [*self.netns_exec(namespace), "sh", "-c", script],
                stdout=sink,
                stderr=subprocess.STDOUT,
                env={**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": address},
            )
        self._responders.append(_Responder(namespace, address, bus, daemon))
        _wait_for_line(log, "Server startup complete", daemon, 15)
        return address

    @property
    def published(self) -> int:
        """How many publications this lab started so far."""
        return len(self._publications)

    def publish(
        self, instance: str, service_type: str, port: int, *, host: str | None = None, responder: int = 0
    ) -> Publication:
        """`avahi-publish-service`; returns once avahi established the name."""
        target = self._responders[responder]
        log = self.workdir / f"publish-{len(self._publications)}.log"
        argv = ["avahi-publish-service"]
        if host is not None:
            argv += ["-H", host]
        argv += [instance, service_type, str(port), "lab=canary"]
        with log.open("wb") as sink:
            process = subprocess.Popen(
                argv,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env={**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": target.bus_address},
            )
        publication = Publication(instance, process)
        self._publications.append(publication)
        _wait_for_line(log, "Established under name", process, 15)
        return publication

    def unpublish(self, publication: Publication) -> None:
        """SIGTERM: avahi withdraws the service with a goodbye (TTL 0)."""
        publication.process.send_signal(signal.SIGTERM)
        publication.process.wait(10)

    def withdraw_since(self, count: int) -> None:
        """Stop every publication after the first `count` (what one test published on a shared lab)."""
        for publication in self._publications[count:]:
            _stop(publication.process)
        del self._publications[count:]

    def kill_responder(self, responder: int = 0) -> None:
        """SIGKILL of the daemon: its services vanish without a goodbye."""
        daemon = self._responders[responder].daemon
        daemon.kill()
        daemon.wait(10)

    # -- teardown ----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every process this lab started (by pid), then delete its namespaces."""
        for publication in self._publications:
            _stop(publication.process)
        for responder in self._responders:
            _stop(responder.daemon)
            _stop(responder.bus)
        for namespace in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
        self.namespaces.clear()


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
