"""Matching observations against a scope (CONTRACT §6.1, 6.3), compiled once per scope.

Providers call the matcher for every advert, hence the closures built once and cached per scope.
Within `filters` the keys combine with AND and a list matches any of its elements; within `exclusions`
every key excludes on its own. `name_prefix` and `instance_prefix` compare case-sensitively (a literal
prefix, as typed). A removal observation is judged only on the fields it carries: a USB `remove` often
lacks vid/pid, and it must still reach the candidate table, which drops it unless its device key is
already a candidate.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from connector.contract.transports import Transport
from connector.core.observations import Observation
from connector.core.scope.model import DiscoveryScope, ScopeFilter
from connector.core.scope.parse import normalise_service_type
from connector.core.transports import TRANSPORT_FACTS

Matcher = Callable[[Observation], bool]
_Test = Callable[[Any], bool]
_Build = Callable[[Any], _Test]


def _service_uuids(value: tuple[str, ...]) -> _Test:
    uuids = frozenset(value)
    return lambda o: not uuids.isdisjoint(map(str.lower, o.service_uuids))


def _manufacturer_ids(value: tuple[int, ...]) -> _Test:
    ids = frozenset(value)
    return lambda o: not ids.isdisjoint(o.manufacturer_data)


def _name_prefix(prefix: str) -> _Test:
    return lambda o: o.name is not None and o.name.startswith(prefix)


def _min_rssi(floor: int) -> _Test:
    return lambda o: o.rssi >= floor


def _addresses(value: tuple[str, ...]) -> _Test:
    addresses = frozenset(value)
    return lambda o: o.address.upper() in addresses


def _vid_pid(value: tuple[tuple[int, int], ...]) -> _Test:
    pairs = frozenset(value)
    return lambda o: o.vid is not None and o.pid is not None and (o.vid, o.pid) in pairs


def _vid_pid_removal(value: tuple[tuple[int, int], ...]) -> _Test:
    pairs = frozenset(value)
    return lambda o: o.vid is None or o.pid is None or (o.vid, o.pid) in pairs


def _serial_numbers(value: tuple[str, ...]) -> _Test:
    serials = frozenset(value)
    return lambda o: o.serial_number is not None and o.serial_number in serials


def _serial_numbers_removal(value: tuple[str, ...]) -> _Test:
    serials = frozenset(value)
    return lambda o: o.serial_number is None or o.serial_number in serials


def _service_types(value: tuple[str, ...]) -> _Test:
    types = frozenset(value)
    return lambda o: normalise_service_type(o.service_type) in types


def _instance_prefix(prefix: str) -> _Test:
    return lambda o: mdns_instance(o.name, o.service_type).startswith(prefix)


@dataclass(frozen=True, slots=True)
class _KeyTest:
    """How one filter key tests an observation; `removal` (absent fields pass) when it differs."""

    present: _Build
    removal: _Build | None = None


# One test per filter key (which keys a transport takes is its `TransportFacts.filter_keys`).
_KEY_TESTS: Mapping[str, _KeyTest] = {
    "service_uuids": _KeyTest(_service_uuids),
    "manufacturer_ids": _KeyTest(_manufacturer_ids),
    "name_prefix": _KeyTest(_name_prefix),
    "min_rssi_dbm": _KeyTest(_min_rssi),
    "addresses": _KeyTest(_addresses),
    "vid_pid": _KeyTest(_vid_pid, _vid_pid_removal),
    "serial_numbers": _KeyTest(_serial_numbers, _serial_numbers_removal),
    "service_types": _KeyTest(_service_types),
    "instance_prefix": _KeyTest(_instance_prefix),
}


def mdns_instance(name: str, service_type: str) -> str:
    """The instance part of an mDNS service name (`Printer._ipp._tcp.local.` -> `Printer`)."""
    bare_type = normalise_service_type(service_type)[:-1]
    stripped = name.rstrip(".")
    lowered = stripped.lower()
    for suffix in (bare_type, bare_type.removesuffix(".local")):
        if lowered.endswith("." + suffix):
            return stripped[: -len(suffix) - 1]
    return stripped


def _is_set(value: object) -> bool:
    # A prefix or a signal floor is set when present (even "" or 0); a list when it holds something.
    return value is not None and (isinstance(value, str | int) or bool(value))


def _tests(scope_filter: ScopeFilter, transport: Transport, *, removal: bool) -> list[_Test]:
    """The tests of the keys set in a filter, in the transport's key order."""
    tests: list[_Test] = []
    for key in TRANSPORT_FACTS[transport].filter_keys:
        value = getattr(scope_filter, key)
        if _is_set(value):
            rule = _KEY_TESTS[key]
            build = rule.removal if removal and rule.removal is not None else rule.present
            tests.append(build(value))
    return tests


def _both(first: _Test, second: _Test) -> _Test:
    return lambda o: first(o) and second(o)


def _either(first: _Test, second: _Test) -> _Test:
    return lambda o: first(o) or second(o)


def _all(tests: Sequence[_Test]) -> _Test:
    if not tests:
        return lambda o: True
    return functools.reduce(_both, tests)


def _any(tests: Sequence[_Test]) -> _Test:
    if not tests:
        return lambda o: False
    return functools.reduce(_either, tests)


def _scope_test(scope: DiscoveryScope, removal: bool) -> _Test:
    """Filters AND-ed, each exclusion key OR-ed and negated, for one event kind."""
    keep = _all(_tests(scope.filters, scope.transport, removal=removal))
    if scope.exclusions is None:
        return keep
    drop = _any(_tests(scope.exclusions, scope.transport, removal=False))
    return lambda o: keep(o) and not drop(o)


@dataclass(frozen=True, slots=True)
class _Compiled:
    """The tests of one scope: for present observations, for removals, and with the type check."""

    present: _Test
    removed: _Test
    matcher: Matcher


# Keyed weakly: a compiled scope lives exactly as long as its scope (whose filters may hold addresses).
_COMPILED: weakref.WeakKeyDictionary[DiscoveryScope, _Compiled] = weakref.WeakKeyDictionary()


def _compile(scope: DiscoveryScope) -> _Compiled:
    facts = TRANSPORT_FACTS[scope.transport]
    kind: Any = facts.observation  # Any: `type(o) is kind` must not narrow `o` to the Observation union
    present = _scope_test(scope, removal=False)
    if not facts.removals:
        return _Compiled(present, present, lambda o: type(o) is kind and present(o))
    removed = _scope_test(scope, removal=True)

    def matcher(observation: Any) -> bool:
        if type(observation) is not kind:
            return False
        return removed(observation) if observation.event == "remove" else present(observation)

    return _Compiled(present, removed, matcher)


def _compiled(scope: DiscoveryScope) -> _Compiled:
    compiled = _COMPILED.get(scope)
    if compiled is None:
        compiled = _COMPILED[scope] = _compile(scope)
    return compiled


def scope_predicate(scope: DiscoveryScope, *, removal: bool = False) -> Callable[[Any], bool]:
    """The scope test for an observation already known to be of the scope's transport (hot paths)."""
    compiled = _compiled(scope)
    return compiled.removed if removal else compiled.present


def scope_matcher(scope: DiscoveryScope) -> Matcher:
    """A fast predicate equivalent to `matches_scope(scope, ...)`, built once per scope."""
    return _compiled(scope).matcher


def matches_scope(scope: DiscoveryScope, observation: Observation) -> bool:
    """True when an observation is in the admitted scope (providers and host use this same rule)."""
    return scope_matcher(scope)(observation)
