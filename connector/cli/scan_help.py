"""What `scan` and `fixtures record` tell a person: filter keys and forms, refusals, and provider hints.

Rules of this file:
- a refusal names the flag and the key at fault and what is allowed (the valid keys of the transport, the
  catalog profile's limit), on one line; it never repeats a value, and a key is repeated only when it looks
  like a key (lowercase letters and underscores), so pasted device data never comes back;
- the provider-unavailable hint is one text for both commands.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Final

from connector.contract.transports import TRANSPORTS
from connector.core.scope import DiscoveryProfile
from connector.errors import SensoriumError

# CLI key -> (transports, form), in the order `--help` lists them.
FILTER_FORMS: Final[Mapping[str, tuple[str, str]]] = {
    "service_uuid": ("ble", "16-bit short form (180d) or 128-bit UUID; repeatable"),
    "manufacturer_id": ("ble", "company id in decimal (89) or 0x hex (0x0059); repeatable"),
    "name_prefix": ("ble", "start of the advertised name, case-sensitive"),
    "min_rssi_dbm": ("ble", "signal floor in dBm, e.g. -70"),
    "address": ("ble", "device address (identity selector; never stored); repeatable"),
    "vid_pid": ("usb-serial", "USB ids in hex, VID:PID (2341:0043); repeatable"),
    "serial_number": ("usb-serial", "USB serial number (identity selector; never stored); repeatable"),
    "service_type": ("mdns", "DNS-SD type (_http._tcp); required for mdns; repeatable"),
    "instance_prefix": ("mdns", "start of the instance name, case-sensitive"),
}
_JSON_TO_CLI: Final[Mapping[str, str]] = {
    "service_uuids": "service_uuid",
    "manufacturer_ids": "manufacturer_id",
    "addresses": "address",
    "serial_numbers": "serial_number",
    "service_types": "service_type",
}
_KEY_LIKE = re.compile(r"^[a-z_]{1,32}$")
_CLI_PATH = re.compile(r"^(--filter|--exclude)/(\d+)(?:/([a-z_]+))?$")

FIXTURE_BY_TRANSPORT: Final[Mapping[str, str]] = {
    "ble": "hw-fixtures/ble-heart-rate-lab.jsonl",
    "usb-serial": "hw-fixtures/usb-serial-lab-rack.jsonl",
    "mdns": "hw-fixtures/mdns-home-network.jsonl",
}
_CHECKS: Final[Mapping[str, str]] = {
    "ble": (
        "is there a powered adapter (`bluetoothctl show` says Powered: yes)? is it blocked (`rfkill list`)? "
        "does the D-Bus policy let this user talk to org.bluez (/etc/dbus-1/system.d/bluetooth.conf)?"
    ),
    "usb-serial": "is the device plugged in, and may this user read /sys/class/tty and /dev/serial/by-id?",
    "mdns": "does --mdns-interfaces name an interface that is up (or is there a default route)?",
}


def keys_for(transport: str) -> list[str]:
    """The CLI filter keys of one transport."""
    return [key for key, (owner, _) in FILTER_FORMS.items() if owner == transport]


def filter_epilog(profile: DiscoveryProfile | None = None) -> str:
    """The `--help` epilog: every filter key with its form, by transport, and the limits."""
    lines = ["filter and exclusion keys (--filter KEY=VALUE, --exclude KEY=VALUE):"]
    for transport in TRANSPORTS:
        lines.append(f"  {transport}:")
        for key in keys_for(transport):
            lines.append(f"    {key:<16} {FILTER_FORMS[key][1]}")
    lines.append("Keys combine with AND; a repeated key matches any value; each --exclude key excludes.")
    if profile is not None:
        lines.append(
            f"Limits of this catalog: --window 1..{profile.max_window_seconds} s, at most "
            f"{profile.max_candidates} candidates; a scan needs at least one filter."
        )
    else:
        lines.append(
            "Limits come from the catalog's scan profile (the example catalog: --window 1..60 s, at most 64 "
            "candidates); a scan needs at least one filter."
        )
    lines.append(
        "Without a radio: --replay hw-fixtures/ble-heart-rate-lab.jsonl (usb-serial-lab-rack.jsonl, "
        "mdns-home-network.jsonl)."
    )
    return "\n".join(lines)


def provider_hint(transport: str) -> str:
    """What to check when a transport's provider is unavailable (the same text for every command)."""
    fixture = FIXTURE_BY_TRANSPORT.get(transport, FIXTURE_BY_TRANSPORT["ble"])
    checks = _CHECKS.get(transport, "")
    return (
        f"hint: {checks} Without hardware, scan a bundled fixture: sensorium-connector scan "
        f"--transport {transport} --window 5 ... --replay {fixture}"
    )


def explain_refusal(
    error: SensoriumError,
    *,
    transport: str,
    filters: Sequence[str],
    exclusions: Sequence[str],
    profile: DiscoveryProfile | None,
) -> str:
    """One line for an input refusal: the flag and key at fault and what is allowed."""
    given = {"--filter": filters, "--exclude": exclusions}
    reasons = []
    for diagnostic in error.diagnostics:
        path, _, rule = diagnostic.get("message", "").rpartition(": ")
        reasons.append(_reason(path, rule, transport, given, profile))
    unique = list(dict.fromkeys(reason for reason in reasons if reason))
    return f"{error.code}: " + ("; ".join(unique) if unique else error.message)


def _valid_keys(transport: str) -> str:
    return f"keys for {transport}: {', '.join(keys_for(transport))}"


def _reason(
    path: str,
    rule: str,
    transport: str,
    given: Mapping[str, Sequence[str]],
    profile: DiscoveryProfile | None,
) -> str:
    cli = _CLI_PATH.match(path)
    if cli is not None:
        return _cli_reason(cli.group(1), int(cli.group(2)), cli.group(3), rule, transport, given)
    if path == "/input/window_seconds":
        limit = profile.max_window_seconds if profile is not None else None
        if rule == "maximum" and limit is not None:
            return f"--window: at most {limit} s (the catalog's max_window_seconds)"
        return f"--window: a whole number of seconds from 1 to {limit or 'the catalog limit'}"
    if path == "/input/filters" and rule == "at-least-one-filter":
        return f"give at least one --filter ({_valid_keys(transport)})"
    if path == "/input/filters/service_types" and rule == "required":
        return "mdns needs --filter service_type=TYPE (e.g. _http._tcp)"
    if path == "/input/adapter":
        return "--adapter: a name of 1 to 64 letters, digits or _ . : - (e.g. hci0)"
    if path.startswith("/input/limits/max_candidates"):
        return "--max-candidates: at least 1 (larger values are cut to the catalog's limit)"
    if path == "/input/transport" and rule == "transport-not-allowed":
        return f"--transport {transport}: the catalog does not allow this transport"
    for flag, prefix in (("--filter", "/input/filters/"), ("--exclude", "/input/exclusions/")):
        if path.startswith(prefix):
            json_key = path[len(prefix) :].split("/")[0]
            key = _JSON_TO_CLI.get(json_key, json_key)
            if rule == "not-for-transport":
                return f"{flag} {key}: not a {transport} key ({_valid_keys(transport)})"
            return f"{flag} {key}: {FILTER_FORMS.get(key, ('', 'see --help'))[1]} ({rule})"
    return f"{path or 'input'}: {rule}"


def _cli_reason(
    flag: str,
    index: int,
    key: str | None,
    rule: str,
    transport: str,
    given: Mapping[str, Sequence[str]],
) -> str:
    pairs = given.get(flag, ())
    typed = pairs[index].partition("=")[0] if index < len(pairs) else ""
    if rule == "key-value-form":
        return f"{flag} takes KEY=VALUE ({_valid_keys(transport)})"
    if rule == "unknown-key":
        named = f'"{typed}"' if _KEY_LIKE.match(typed) else "(not shown)"
        return f"{flag}: unknown key {named}; {_valid_keys(transport)}"
    if rule == "repeated-key" and key is not None:
        return f"{flag} {key}: given twice; it takes one value"
    if key is not None:
        return f"{flag} {key}: expects {FILTER_FORMS.get(key, ('', 'see --help'))[1]}"
    return f"{flag}: {rule}"
