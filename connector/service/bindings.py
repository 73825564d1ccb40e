"""GET /v1/bindings (SPEC 9): a caller's own bindings with their addresses; an operator's view of all."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from connector.service.answers import Done
from connector.storage.state import Binding

if TYPE_CHECKING:
    from connector.service.connector import ConnectorService


async def list_bindings(service: ConnectorService, token: str | None) -> Done:
    """The bindings this principal may see: its own with `address`, or (operator) every one with `owner`."""
    principal = service.authenticate(token)
    if principal.role == "operator":
        every = await service.state.list_bindings(None)
        return Done({"bindings": [_operator_entry(b) for b in every]})
    own = await service.state.list_bindings(principal.principal_id)
    return Done({"bindings": [_caller_entry(b) for b in own]})


def _common(binding: Binding) -> dict[str, Any]:
    return {
        "binding/id": binding.binding_id,
        "transport": binding.transport,
        "bound_at": binding.bound_at.strftime("%Y-%m-%dT%H:%M:%SZ"),  # as on the binding itself
    }


def _caller_entry(binding: Binding) -> dict[str, Any]:
    return {**_common(binding), "address": binding.address}


def _operator_entry(binding: Binding) -> dict[str, Any]:
    # An operator manages bindings (and may forget any) but never learns a device's address.
    return {**_common(binding), "owner": binding.owner}
