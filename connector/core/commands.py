"""A `class: command` catalog action as admission and the runner see it, and its input rule (CONTRACT §2 step
6).

Pure: the process side (argv resolution, environment, workers) stays in `connector.runtime.commands`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from connector.contract.canonical import canonical_bytes
from connector.contract.catalog_models import CatalogAction
from connector.core.policy import retry_after
from connector.errors import AdmissionError, Code, SensoriumError

DEFAULT_MAX_INPUT_BYTES = 65536


@dataclass(frozen=True, slots=True)
class CommandAction:
    """What the runner needs of a `class: command` catalog action."""

    action_id: str
    argv: tuple[str, ...]
    timeout_ms: int
    cancel: Literal["terminate", "none"]
    input: Literal["stdin-json", "none"]
    execution_mode_support: str = "sync-only"
    retry_after_seconds: int = 1
    preferred_max_ttl_seconds: int | None = None

    @classmethod
    def from_catalog(cls, action: CatalogAction) -> CommandAction:
        """Build from a verified catalog action; `unknown-action` if it is not a command action."""
        if action.command is None:
            raise SensoriumError("not a command action", code=Code.UNKNOWN_ACTION)
        profile = action.deferred_profile
        return cls(
            action_id=action.action_id,
            argv=tuple(action.command.argv),
            timeout_ms=action.command.timeout_ms,
            cancel=action.command.cancel,
            input=action.command.input,
            execution_mode_support=action.execution_mode_support,
            retry_after_seconds=retry_after(profile),
            preferred_max_ttl_seconds=profile.preferred_max_ttl_seconds if profile else None,
        )

    @property
    def cancelable(self) -> bool:
        """True when running work can be terminated."""
        return self.cancel == "terminate"


def check_command_input(
    action: CommandAction, value: Mapping[str, Any], *, max_bytes: int = DEFAULT_MAX_INPUT_BYTES
) -> bytes | None:
    """The stdin bytes for this input (None for `input: none`); `invalid-input` when it does not fit."""
    if action.input == "none":
        if value:
            raise _invalid_input("/input", "must-be-empty")
        return None
    try:
        body = canonical_bytes(dict(value))
    except Exception as error:  # rfc8785 raises several types for values JSON cannot carry
        raise _invalid_input("/input", "not-canonical-json") from error
    if len(body) > max_bytes:
        raise _invalid_input("/input", "too-large")
    return body


def _invalid_input(path: str, rule: str) -> AdmissionError:
    """An `invalid-input` refusal naming the path and rule, never the value."""
    return AdmissionError(
        "input refused",
        code=Code.INVALID_INPUT,
        diagnostics=[{"code": Code.INVALID_INPUT, "message": f"{path}: {rule}"}],
    )
