"""Interface choice for mDNS sessions (CONTRACT §12 `--mdns-interfaces`): pure parts and the CLI flag."""

from __future__ import annotations

import argparse
from argparse import Namespace
from typing import Any

import ifaddr
import pytest
from zeroconf import IPVersion

from connector.cli import fixtures_cmd, scan_cmd, serve_cmd
from providers.mdns import MdnsProvider
from providers.mdns_interfaces import (
    NoMulticastInterface,
    ipv4_route_interface,
    ipv6_default_interface,
    parse_setting,
    select_interfaces,
)
from providers.registry import build_provider

UP_MULTICAST = 0x1 | 0x1000

# /proc/net/route: a default route via eth0, a docker bridge, and a multicast route (hex, little-endian).
ROUTES_V4 = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t0102000A\t0003\t0\t0\t100\t00000000\t0\t0\t0
docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
"""
ROUTES_V4_MULTICAST = ROUTES_V4 + "lo\t000000E0\t00000000\t0001\t0\t0\t0\t000000F0\t0\t0\t0\n"
# /proc/net/ipv6_route: the kernel's unreachable default on lo (REJECT) and a real default via wlan0.
ROUTES_V6 = (
    "00000000000000000000000000000000 00 00000000000000000000000000000000 00 "
    "00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n"
    "00000000000000000000000000000000 00 00000000000000000000000000000000 00 "
    "fe800000000000000000000000000001 00000400 00000001 00000000 00450003    wlan0\n"
)


def adapter(name: str, index: int, *ips: Any) -> ifaddr.Adapter:
    """An ifaddr adapter with IPv4 (str) and IPv6 ((addr, flowinfo, scope)) addresses."""
    return ifaddr.Adapter(name, name, [ifaddr.IP(ip, 24, name) for ip in ips], index=index)


ADAPTERS = [
    adapter("lo", 1, "127.0.0.1", ("::1", 0, 0)),
    adapter("eth0", 2, "192.0.2.2", ("fe80::2", 0, 2)),
    adapter("docker0", 3, "172.17.0.1"),
    adapter("wlan0", 4, ("fe80::4", 0, 4)),
]
FLAGS = {"lo": 0x1 | 0x8, "eth0": UP_MULTICAST, "docker0": UP_MULTICAST, "wlan0": UP_MULTICAST}


def select(setting: Any, route: str | None) -> Any:
    return select_interfaces(
        setting, adapters=lambda: ADAPTERS, flags=FLAGS.get, route_interface=lambda: route
    )


def test_route_tables_are_read_like_the_kernel_picks_a_route() -> None:
    assert ipv4_route_interface(ROUTES_V4) == "eth0"
    assert ipv4_route_interface(ROUTES_V4_MULTICAST) == "lo"  # 224.0.0.0/4 beats the default route
    assert ipv4_route_interface("Iface\tDestination\n") is None
    assert ipv6_default_interface(ROUTES_V6) == "wlan0"
    assert ipv6_default_interface(ROUTES_V6.splitlines()[0]) is None


def test_the_default_is_the_route_interface_with_ipv4_and_its_ipv6_index() -> None:
    chosen = select(None, "eth0")
    assert chosen.interfaces == ("192.0.2.2", 2) and chosen.ip_version is IPVersion.All
    v6_only = select(None, "wlan0")
    assert v6_only.interfaces == (4,) and v6_only.ip_version is IPVersion.V6Only


def test_all_is_every_up_multicast_interface_but_not_a_loopback_without_the_flag() -> None:
    chosen = select("all", None)
    assert chosen.interfaces == ("172.17.0.1", "192.0.2.2", 2, 4)
    assert chosen.ip_version is IPVersion.All


@pytest.mark.parametrize(("setting", "route"), [(None, None), (None, "lo"), (None, "gone0")])
def test_no_usable_default_interface_is_a_fixed_one_line_reason(setting: Any, route: str | None) -> None:
    with pytest.raises(NoMulticastInterface) as refused:
        select(setting, route)
    assert str(refused.value) == "no multicast-capable interface on the default route"


def test_an_explicit_list_is_taken_as_given_when_every_address_exists() -> None:
    chosen = select(("127.0.0.1",), None)  # the tests' pin: lo works although it lacks the flag
    assert chosen.interfaces == ("127.0.0.1",) and chosen.ip_version is IPVersion.V4Only
    assert select(("127.0.0.1", "fe80::2"), None).ip_version is IPVersion.All
    with pytest.raises(NoMulticastInterface):
        select(("192.0.2.99",), None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("all", "all"), (" ALL ", "all"), ("127.0.0.1", ("127.0.0.1",)), ("::1, 10.0.0.1", ("::1", "10.0.0.1"))],
)
def test_the_flag_takes_addresses_of_either_family_or_all(text: str, expected: Any) -> None:
    assert parse_setting(text) == expected
    assert scan_cmd._interfaces(text) == expected
    assert fixtures_cmd._interfaces(text) == expected
    assert serve_cmd._mdns_interfaces(text) == expected


@pytest.mark.parametrize("text", ["", ",", "eth0", "10.0.0.1,SECRET-value"])
def test_the_flag_refuses_anything_else_without_echoing_it(text: str) -> None:
    for parse in (scan_cmd._interfaces, fixtures_cmd._interfaces):
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            parse(text)
        assert "SECRET" not in str(refused.value) and "eth0" not in str(refused.value)
    with pytest.raises(ValueError, match="--mdns-interfaces takes IP addresses"):
        serve_cmd._mdns_interfaces(text)


def test_all_reaches_the_provider_as_all() -> None:
    provider = build_provider("mdns", mdns_interfaces="all")
    assert isinstance(provider, MdnsProvider) and provider._interfaces == "all"
    assert build_provider("mdns", mdns_interfaces=None)._interfaces is None  # type: ignore[attr-defined]
    config = serve_cmd.config_from(
        Namespace(
            data_dir=".",
            catalog=None,
            trust=None,
            replay=[],
            replay_speed=1.0,
            ble_adapter=None,
            mdns_interfaces="all",
            nats=None,
            nats_service="sensorium-os",
        )
    )
    assert config.mdns_interfaces == "all"
