"""The transport table: one entry per contract transport, each fact consistent with the code that reads it."""

from __future__ import annotations

import dataclasses
import typing

from connector.contract.transports import TRANSPORTS, Transport
from connector.core.scope import ALL_FILTER_KEYS, ScopeFilter
from connector.core.transports import TRANSPORT_FACTS, facts

BACKEND_OPTIONS = {"adapter", "interfaces", "every_report"}


def test_one_entry_per_contract_transport_in_contract_order() -> None:
    assert tuple(TRANSPORT_FACTS) == TRANSPORTS == typing.get_args(Transport)
    assert all(facts(transport).transport == transport for transport in TRANSPORTS)


def test_filter_keys_are_scope_filter_fields_and_no_key_has_two_transports() -> None:
    fields = {field.name for field in dataclasses.fields(ScopeFilter)}
    keys = [key for entry in TRANSPORT_FACTS.values() for key in entry.filter_keys]
    assert len(keys) == len(set(keys))
    assert set(keys) == ALL_FILTER_KEYS == fields
    for entry in TRANSPORT_FACTS.values():
        assert set(entry.required_filters) <= set(entry.filter_keys)


def test_events_are_the_observation_event_literals() -> None:
    for transport, entry in TRANSPORT_FACTS.items():
        event = typing.get_type_hints(entry.observation).get("event")
        assert entry.events == (typing.get_args(event) if event is not None else ()), transport
        assert entry.removals == ("remove" in entry.events)


def test_backend_options_and_the_transport_specific_flags() -> None:
    for entry in TRANSPORT_FACTS.values():
        assert set(entry.provider_options) <= BACKEND_OPTIONS
    assert [t for t in TRANSPORTS if facts(t).takes("adapter")] == ["ble"]
    assert [t for t in TRANSPORTS if facts(t).takes("interfaces")] == ["mdns"]
    assert [t for t in TRANSPORTS if facts(t).required_filters] == ["mdns"]
    assert [t for t in TRANSPORTS if facts(t).signal] == ["ble"]
