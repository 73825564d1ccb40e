"""The `scan` flags' forms of a discovery input (CONTRACT §12): `--filter KEY=VALUE` pairs to the JSON
`input`.

Malformed pairs are refused like the core refuses an input: `path: rule` diagnostics, never the value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from connector.core.scope import Problems, expand_uuid

_HEX16 = re.compile(r"[0-9a-fA-F]{1,4}")

_CLI_LIST_KEYS: Mapping[str, str] = {
    "service_uuid": "service_uuids",
    "manufacturer_id": "manufacturer_ids",
    "address": "addresses",
    "vid_pid": "vid_pid",
    "serial_number": "serial_numbers",
    "service_type": "service_types",
}
_CLI_SCALAR_KEYS: Mapping[str, str] = {
    "name_prefix": "name_prefix",
    "min_rssi_dbm": "min_rssi_dbm",
    "instance_prefix": "instance_prefix",
}


def _int(text: str, base: int = 10) -> int | None:
    try:
        return int(text, base)
    except ValueError:
        return None


def _vid_pid(text: str) -> dict[str, int] | None:
    vid, sep, pid = text.partition(":")
    if not sep or not _HEX16.fullmatch(vid) or not _HEX16.fullmatch(pid):
        return None
    return {"vid": int(vid, 16), "pid": int(pid, 16)}


def _value(key: str, text: str) -> object:
    """Convert one CLI value to its JSON form; None when malformed."""
    if key == "service_uuid":
        return expand_uuid(text)
    if key == "manufacturer_id":
        # Decimal (as CONTRACT §13 fixtures write company ids) or 0x hex (as the scan table prints them).
        if re.fullmatch(r"0[xX][0-9a-fA-F]{1,4}", text):
            return int(text, 16)
        return _int(text) if re.fullmatch(r"[0-9]+", text) else None
    if key == "min_rssi_dbm":
        return _int(text) if re.fullmatch(r"-?[0-9]+", text) else None
    if key == "vid_pid":
        return _vid_pid(text)
    return text if text else None


def _filter_pairs(pairs: Sequence[str], flag: str, problems: Problems) -> dict[str, Any]:
    """`KEY=VALUE` pairs to one `filters`/`exclusions` object; list keys accumulate."""
    result: dict[str, Any] = {}
    for index, pair in enumerate(pairs):
        path = f"{flag}/{index}"
        key, sep, text = pair.partition("=")
        if not sep:
            problems.add(path, "key-value-form")
        elif key in _CLI_LIST_KEYS:
            value = _value(key, text)
            if value is None:
                problems.add(f"{path}/{key}", "value-form")
            else:
                result.setdefault(_CLI_LIST_KEYS[key], []).append(value)
        elif key in _CLI_SCALAR_KEYS:
            value = _value(key, text)
            if value is None:
                problems.add(f"{path}/{key}", "value-form")
            elif _CLI_SCALAR_KEYS[key] in result:
                problems.add(f"{path}/{key}", "repeated-key")
            else:
                result[_CLI_SCALAR_KEYS[key]] = value
        else:
            problems.add(path, "unknown-key")
    return result


def scope_input_from_cli(
    transport: str,
    window_seconds: int,
    filters: Sequence[str],
    exclusions: Sequence[str],
    max_candidates: int | None,
    adapter: str | None,
) -> dict[str, Any]:
    """Build a discovery `input` from `scan` flags; refuse malformed `KEY=VALUE` pairs."""
    problems = Problems()
    raw: dict[str, Any] = {"transport": transport, "window_seconds": window_seconds}
    parsed_filters = _filter_pairs(filters, "--filter", problems)
    parsed_exclusions = _filter_pairs(exclusions, "--exclude", problems)
    problems.raise_if_any()
    if parsed_filters:
        raw["filters"] = parsed_filters
    if parsed_exclusions:
        raw["exclusions"] = parsed_exclusions
    if max_candidates is not None:
        raw["limits"] = {"max_candidates": max_candidates}
    if adapter is not None:
        raw["adapter"] = adapter
    return raw
