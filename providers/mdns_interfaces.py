"""Which network interfaces an mDNS session queries on (CONTRACT §12 `--mdns-interfaces`), chosen at session
start.

- default (`None`): the interface the kernel routes mDNS to - its route to `224.0.0.251`, as python-zeroconf's
  `InterfaceChoice.Default` binds it, else the IPv6 default route - with its IPv4 address and its IPv6
  index (python-zeroconf's `Default` cannot send IPv6 multicast: `_utils/net.py normalize_interface_choice`
  warns and binds `::`; an explicit interface index can);
- `"all"`: every interface that is up and multicast-capable;
- an explicit list of interface addresses (IPv4 or IPv6), passed to python-zeroconf as given.

The choice is made again at every session start, so interfaces that came or went since the last session count.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import ifaddr
from zeroconf import IPVersion

ALL: Literal["all"] = "all"
InterfaceSetting = tuple[str, ...] | Literal["all"] | None

_SIOCGIFFLAGS = 0x8913  # linux/sockios.h
_IFF_UP = 0x1
_IFF_MULTICAST = 0x1000
_MDNS_GROUP_V4 = "224.0.0.251"
_ROUTE_V4 = "/proc/net/route"  # /proc/net follows the reading thread's network namespace
_ROUTE_V6 = "/proc/net/ipv6_route"
_RTF_UP = 0x1
_RTF_REJECT = 0x200


class NoMulticastInterface(Exception):
    """No interface to query on; the message is a fixed one-line reason."""


@dataclass(frozen=True, slots=True)
class Selection:
    """What python-zeroconf is given: IPv4 addresses and IPv6 interface indexes (or addresses)."""

    interfaces: tuple[str | int, ...]
    ip_version: IPVersion


def parse_setting(text: str) -> tuple[str, ...] | Literal["all"]:
    """`IP[,IP...]` or `all`; ValueError with a fixed reason (never the value)."""
    if text.strip().lower() == ALL:
        return ALL
    return checked_addresses(part.strip() for part in text.split(",") if part.strip())


def checked_addresses(addresses: Iterable[str]) -> tuple[str, ...]:
    """Normalised IPv4/IPv6 interface addresses; ValueError when one is not an address or none is given."""
    try:
        checked = tuple(str(ipaddress.ip_address(address)) for address in addresses)
    except ValueError:
        raise ValueError("mdns interfaces must be IP addresses or all") from None
    if not checked:
        raise ValueError("mdns interfaces must name at least one address")
    return checked


def check_setting(setting: Sequence[str] | str | None) -> InterfaceSetting:
    """A validated setting from what a caller configured."""
    if setting is None:
        return None
    if isinstance(setting, str):
        return parse_setting(setting)
    return checked_addresses(setting)


def select_interfaces(
    setting: InterfaceSetting,
    *,
    adapters: Callable[[], Iterable[ifaddr.Adapter]] = ifaddr.get_adapters,
    flags: Callable[[str], int | None] | None = None,
    route_interface: Callable[[], str | None] | None = None,
) -> Selection:
    """The interfaces for one session; raises NoMulticastInterface when there is none."""
    found = list(adapters())
    if setting is not None and setting != ALL:
        # python-zeroconf leaks its listen socket when joining an address of no interface raises (ENODEV).
        known = set().union(*(_plain_ips(a) for a in found))
        if not all(address in known for address in setting):
            raise NoMulticastInterface("an mdns interface address is not assigned to any interface")
        return _explicit(setting)
    read_flags = flags or interface_flags
    usable = [a for a in found if _multicast_capable(read_flags(a.nice_name))]
    if setting == ALL:
        chosen = usable
        reason = "no multicast-capable interface is up"
    else:
        chosen = _default_route_adapters(usable, route_interface or kernel_route_interface)
        reason = "no multicast-capable interface on the default route"
    selection = _from_adapters(chosen)
    if not selection.interfaces:
        raise NoMulticastInterface(reason)
    return selection


def _explicit(addresses: Sequence[str]) -> Selection:
    has_v4 = any(ipaddress.ip_address(a).version == 4 for a in addresses)
    has_v6 = any(ipaddress.ip_address(a).version == 6 for a in addresses)
    return Selection(tuple(addresses), _version(has_v4, has_v6))


def _version(has_v4: bool, has_v6: bool) -> IPVersion:
    if has_v4 and has_v6:
        return IPVersion.All
    return IPVersion.V6Only if has_v6 else IPVersion.V4Only


def _multicast_capable(flags: int | None) -> bool:
    return flags is not None and flags & _IFF_UP != 0 and flags & _IFF_MULTICAST != 0


def _default_route_adapters(
    usable: Sequence[ifaddr.Adapter], route_interface: Callable[[], str | None]
) -> list[ifaddr.Adapter]:
    """The usable adapter the mDNS route goes out of."""
    name = route_interface()
    return [a for a in usable if a.nice_name == name]


def _plain_ips(adapter: ifaddr.Adapter) -> set[str]:
    return {ip.ip if isinstance(ip.ip, str) else ip.ip[0] for ip in adapter.ips}


def _from_adapters(adapters: Iterable[ifaddr.Adapter]) -> Selection:
    """One IPv4 address per adapter (a second one would join the same group twice) and its IPv6 index."""
    chosen: list[str | int] = []
    has_v4 = has_v6 = False
    for adapter in sorted(adapters, key=lambda a: a.nice_name):
        v4 = sorted(ip.ip for ip in adapter.ips if isinstance(ip.ip, str))
        if v4:
            chosen.append(v4[0])
            has_v4 = True
        if adapter.index is not None and any(isinstance(ip.ip, tuple) for ip in adapter.ips):
            chosen.append(adapter.index)
            has_v6 = True
    return Selection(tuple(chosen), _version(has_v4, has_v6))


def interface_flags(name: str) -> int | None:
    """`SIOCGIFFLAGS` of an interface in this thread's network namespace, or None when it is gone."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("16sH", name.encode()[:15], 0)
        try:
            answer = fcntl.ioctl(probe.fileno(), _SIOCGIFFLAGS, request)
        except OSError:
            return None
    flags: int = struct.unpack("16sH", answer[:18])[1]
    return flags


def kernel_route_interface() -> str | None:
    """The interface of the kernel's route to `224.0.0.251` (this network namespace), else of `::/0`."""
    return _first_readable(_ROUTE_V4, ipv4_route_interface) or _first_readable(
        _ROUTE_V6, ipv6_default_interface
    )


def _first_readable(path: str, parse: Callable[[str], str | None]) -> str | None:
    try:
        with open(path, encoding="ascii") as table:
            return parse(table.read())
    except (OSError, ValueError):
        return None


def ipv4_route_interface(table: str, group: str = _MDNS_GROUP_V4) -> str | None:
    """Longest-prefix (then lowest-metric) match for `group` in a `/proc/net/route` table."""
    target = int.from_bytes(socket.inet_aton(group), "little")  # the table is in host (little-endian) order
    best: tuple[int, int, str] | None = None
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        name, destination, flags, metric, mask = fields[0], fields[1], fields[3], fields[6], fields[7]
        if int(flags, 16) & _RTF_UP == 0 or target & int(mask, 16) != int(destination, 16):
            continue
        rank = (bin(int(mask, 16)).count("1"), -int(metric))
        if best is None or rank > best[:2]:
            best = (*rank, name)
    return None if best is None else best[2]


def ipv6_default_interface(table: str) -> str | None:
    """The interface of the usable `::/0` route with the lowest metric in a `/proc/net/ipv6_route` table."""
    best: tuple[int, str] | None = None
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 10 or fields[1] != "00" or int(fields[0], 16) != 0:
            continue
        flags = int(fields[8], 16)
        if flags & _RTF_UP == 0 or flags & _RTF_REJECT:
            continue
        candidate = (int(fields[5], 16), fields[9])
        if best is None or candidate < best:
            best = candidate
    return None if best is None else best[1]
