"""Discovery scope: the admitted transport, window, limits and filters of one scan (CONTRACT §6.1, 6.3).

`model` holds the profile, the scope and the filter vocabulary; `parse` turns a caller's `input` into a
scope (refusals name paths and rules, never values); `match` compiles a scope into the predicate every
provider applies; `redact` gives its durable form. What differs between transports is in
`connector.core.transports`.
"""

from connector.core.scope.match import matches_scope, mdns_instance, scope_matcher, scope_predicate
from connector.core.scope.model import (
    ALL_FILTER_KEYS,
    EMPTY_SNAPSHOT_BYTES,
    RSSI_RANGE,
    DiscoveryProfile,
    DiscoveryScope,
    ScopeFilter,
)
from connector.core.scope.parse import (
    Problems,
    expand_uuid,
    normalise_service_type,
    normalised_input,
    parse_discovery_input,
)
from connector.core.scope.redact import backend_filter_hint, redacted_scope

__all__ = [
    "ALL_FILTER_KEYS",
    "EMPTY_SNAPSHOT_BYTES",
    "RSSI_RANGE",
    "DiscoveryProfile",
    "DiscoveryScope",
    "Problems",
    "ScopeFilter",
    "backend_filter_hint",
    "expand_uuid",
    "matches_scope",
    "mdns_instance",
    "normalise_service_type",
    "normalised_input",
    "parse_discovery_input",
    "redacted_scope",
    "scope_matcher",
    "scope_predicate",
]
