"""Test principals on disk and their bearer tokens."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from connector.core.authority import Grant, make_grant
from connector.storage.principals import add_principal


class Tokens(dict[str, str]):
    """Bearer tokens by principal name; `tokens.alice` reads `tokens["alice"]`."""

    def __getattr__(self, name: str) -> str:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def auth(self, name: str) -> dict[str, str]:
        """The Authorization header of a principal."""
        return bearer(self[name])


def create_principals(
    data_dir: Path,
    callers: Mapping[str, Iterable[str | Grant]] | None = None,
    operators: Iterable[str] = (),
) -> Tokens:
    """Add callers (an action id grants it on every transport) and operators; answer their tokens."""
    tokens = Tokens()
    for name, grants in (callers or {}).items():
        granted = [grant if isinstance(grant, Grant) else make_grant(grant) for grant in grants]
        tokens[name] = add_principal(data_dir, name, "caller", granted)
    for name in operators:
        tokens[name] = add_principal(data_dir, name, "operator")
    return tokens


def bearer(token: str) -> dict[str, str]:
    """The Authorization header of a token."""
    return {"Authorization": f"Bearer {token}"}
