"""Benchmark of the USB/serial provider: CPU per enumeration pass with 32 fake USB-serial ports.

The ports live in a private mount namespace (tests/providers/serial_ns.py: real sysfs layouts, by-id
links): 8 FT232R (one interface), 8 FT2232H (two interfaces each, 16 ports) and 8 CDC-ACM boards, plus
the console `ttyS0`. Contenders, interleaved per round, CPU time (`time.process_time`) per pass:
- `pyserial`: `serial.tools.list_ports.comports()` alone (the library's own sysfs walk, the reference);
- `provider`: what the provider's worker does per pass - `comports()`, the by-id link map, the scope
  filter and the diff against the previous pass (`providers.serial.enumeration_pass`).

    sudo .venv/bin/python bench/usb_bench.py [--rounds 7] [--passes 200]
    (without root it retries in a user namespace: unshare --user --map-root-user)
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the test peers: tests.providers.*

from tests.providers import serial_ns  # noqa: E402
from tests.providers.serial_ns import FakePort, FakeUsb  # noqa: E402


def fake_ports() -> dict[str, FakePort | None]:
    """32 USB-serial ports of three real kinds, plus the console."""
    ports: dict[str, FakePort | None] = {"ttyS0": None}
    usb = 0
    for n in range(8):
        ft232 = FakeUsb(f"1-{n + 1}", "usb-serial", 0x0403, 0x6001, f"A{n:07d}", "FTDI", "FT232R USB UART", 1)
        ports[f"ttyUSB{usb}"] = FakePort(
            ft232, 0, "FT232R USB UART", f"usb-FTDI_FT232R_USB_UART_A{n:07d}-if00-port0"
        )
        usb += 1
    for n in range(8):
        dual = FakeUsb(f"2-{n + 1}", "usb-serial", 0x0403, 0x6010, f"FT{n:06d}", "FTDI", "Dual RS232-HS", 2)
        for interface in (0, 1):
            link = f"usb-FTDI_Dual_RS232-HS_FT{n:06d}-if{interface:02d}-port0"
            ports[f"ttyUSB{usb}"] = FakePort(dual, interface, None, link)
            usb += 1
    for n in range(8):
        acm = FakeUsb(
            f"3-{n + 1}", "usb", 0x2341, 0x0043, f"8573{n:04d}", "Arduino (www.arduino.cc)", "Uno", 2
        )
        ports[f"ttyACM{n}"] = FakePort(acm, 0, None, f"usb-Arduino__www.arduino.cc__0043_8573{n:04d}-if00")
    return ports


def inside(root: Path, rounds: int, passes: int) -> None:
    """Namespace side: build the ports, then time the contenders."""
    from serial.tools import list_ports

    from connector.core.observations import UsbObservation
    from connector.core.scope import DiscoveryScope, ScopeFilter
    from providers.serial import enumeration_pass, stable_links

    serial_ns.DEVICES = fake_ports()
    serial_ns.build_fake_system(root)
    for name in serial_ns.DEVICES:
        serial_ns.add_device(root, name)
    scope = DiscoveryScope("usb-serial", 60, 64, 65536, ScopeFilter())
    listed = list_ports.comports()
    first, _ = enumeration_pass(scope, listed, {}, stable_links())
    assert len(listed) == 33 and len(first) == 32, (len(listed), len(first))

    def pyserial() -> None:
        list_ports.comports()

    state: dict[str, UsbObservation] = {}

    def provider() -> None:
        nonlocal state
        _, state = enumeration_pass(scope, list_ports.comports(), state, stable_links())

    results: dict[str, list[float]] = {"pyserial": [], "provider": []}
    for round_no in range(rounds):
        order = [("pyserial", pyserial), ("provider", provider)]
        for name, run in order if round_no % 2 == 0 else reversed(order):
            started = time.process_time()
            for _ in range(passes):
                run()
            results[name].append((time.process_time() - started) / passes * 1000)
    base, ours = statistics.median(results["pyserial"]), statistics.median(results["provider"])
    print(
        "command:",
        shlex.join(
            [".venv/bin/python", "bench/usb_bench.py", "--rounds", str(rounds), "--passes", str(passes)]
        ),
    )
    print(
        f"CPU per enumeration pass, 32 USB-serial ports + ttyS0, median of {rounds} rounds x {passes} passes:"
    )
    print(f"  pyserial comports()        {base:6.2f} ms")
    print(f"  provider pass              {ours:6.2f} ms   (by-id links, filter, diff included)")
    print(f"  ratio provider / pyserial = {ours / base:.2f}")
    print(f"  at the default 0.5 s poll interval: {ours / 500 * 100:.2f} % of one core")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--passes", type=int, default=200)
    parser.add_argument("--inside", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside is not None:
        inside(args.inside, args.rounds, args.passes)
        return
    prefix = serial_ns.namespace_prefix()
    if prefix is None:
        raise SystemExit("usb_bench: unshare --mount is not permitted here")
    with tempfile.TemporaryDirectory(prefix="s11-usb-bench-") as workdir:
        root = Path(workdir) / "root"
        root.mkdir()
        command = [*prefix, sys.executable, str(Path(__file__).resolve()), "--inside", str(root)]
        command += ["--rounds", str(args.rounds), "--passes", str(args.passes)]
        subprocess.run(command, check=True)


if __name__ == "__main__":
    main()
