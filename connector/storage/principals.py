"""`<data-dir>/principals.json`: principals with token hashes and grants (CONTRACT §8), and the live
directory.

The file holds SHA-256 hex digests only, never a token. Every write is atomic (temp file, fsync, rename,
mode 0600) under an advisory lock, so the CLI and a running server can both change it safely.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from connector.core.authority import (
    TOKEN_SHA256_PATTERN,
    Grant,
    Principal,
    authenticate,
    check_principal_id,
    check_role,
    hash_token,
    lost_actions,
    make_grant,
    still_authenticated,
)
from connector.errors import Code, SensoriumError
from connector.storage.files import make_private_dir

SCHEMA = "sensorium-principals.v1"
FILE_NAME = "principals.json"
LOCK_NAME = "principals.json.lock"

_log = logging.getLogger(__name__)

RevokedCallback = Callable[[str, frozenset[str]], None]


def principals_path(data_dir: Path) -> Path:
    """Where the principals file lives under a data dir."""
    return Path(data_dir) / FILE_NAME


def load_principals(data_dir: Path) -> tuple[Principal, ...]:
    """Every principal in the file (none when the file does not exist); `principals-malformed` if broken."""
    path = principals_path(data_dir)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return ()
    except OSError as error:
        raise _malformed("principals file is unreadable") from error
    try:
        return _parse_document(json.loads(raw))
    except ValueError as error:
        raise _malformed("principals file is not valid JSON") from error


def add_principal(data_dir: Path, principal_id: str, role: str, grants: Sequence[Grant] = ()) -> str:
    """Create a principal and return its new bearer token (shown once; only its hash is stored)."""
    check_principal_id(principal_id)
    checked_role = check_role(role)
    if checked_role == "operator" and grants:
        raise SensoriumError("operators hold no caller grants", code=Code.INVALID_INPUT)
    _check_unique_grants(grants)
    token = secrets.token_urlsafe(32)
    with _locked(data_dir):
        current = load_principals(data_dir)
        if any(p.principal_id == principal_id for p in current):
            raise SensoriumError("a principal with this id already exists", code=Code.PRINCIPAL_EXISTS)
        created = Principal(principal_id, checked_role, hash_token(token), tuple(grants))
        _save(data_dir, (*current, created))
    return token


def revoke(data_dir: Path, principal_id: str, action_id: str | None = None) -> frozenset[str]:
    """Remove one grant, or (no action) revoke the principal entirely; returns the action ids it lost."""
    with _locked(data_dir):
        current = load_principals(data_dir)
        before = _find(current, principal_id)
        after = _revoked_version(before, action_id)
        _save(data_dir, tuple(after if p is before else p for p in current))
    return lost_actions(before, after)


def list_principals(data_dir: Path) -> tuple[Principal, ...]:
    """Every principal, in file order."""
    return load_principals(data_dir)


@dataclass(frozen=True, slots=True)
class _FileStamp:
    """What a cheap stat says about the file; an atomic replace always changes the inode."""

    inode: int
    mtime_ns: int
    size: int


class PrincipalDirectory:
    """The running server's view of the principals file, reloaded when the file changes."""

    def __init__(self, data_dir: Path) -> None:
        self._data_dir = Path(data_dir)
        self._path = str(principals_path(self._data_dir))  # stat'd on every request: built once
        self._callbacks: list[RevokedCallback] = []
        self._stamp = self._stat()
        self._last_good = load_principals(self._data_dir)
        self._current = self._last_good
        self.healthy = True

    @property
    def principals(self) -> tuple[Principal, ...]:
        """The principals used for authentication right now."""
        return self._current

    def get(self, principal_id: str) -> Principal | None:
        """The current version of one principal, if any."""
        return next((p for p in self._current if p.principal_id == principal_id), None)

    def authenticate(self, token: str | None) -> Principal:
        """Authenticate against the current principals (call `reload_if_changed` first)."""
        return authenticate(token, self._current)

    def current(self, principal: Principal) -> Principal:
        """The principal as the principals file says now (picking up a change), `unauthenticated` once its
        token no longer authenticates: a re-check of authority after a wait, not a second authentication."""
        self.reload_if_changed()
        return still_authenticated(principal, self._current)

    def on_revoked(self, callback: RevokedCallback) -> Callable[[], None]:
        """Call `callback(principal_id, lost_action_ids)` on every revocation; returns the undo function."""
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback) if callback in self._callbacks else None

    def reload_if_changed(self) -> bool:
        """Reload when the file's inode, mtime or size changed; True when a reload happened."""
        stamp = self._stat()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        self._reload()
        return True

    def revoke_now(self, principal_id: str, action_id: str | None = None) -> frozenset[str]:
        """Revoke in the file and apply it at once (admin route); returns the action ids lost."""
        lost = revoke(self._data_dir, principal_id, action_id)
        self._stamp = self._stat()
        self._reload()
        return lost

    def _reload(self) -> None:
        """Swap in the file's principals and fire callbacks for everything that was narrowed."""
        try:
            fresh = load_principals(self._data_dir)
        except SensoriumError:
            # Fail closed: nobody authenticates until the file is fixed; diffs stay against the last good set.
            _log.warning("principals file refused; authentication disabled until it is fixed")
            self._current, self.healthy = (), False
            return
        previous, self._last_good, self._current, self.healthy = self._last_good, fresh, fresh, True
        self._fire(previous, fresh)

    def _fire(self, previous: Sequence[Principal], fresh: Sequence[Principal]) -> None:
        """Notify callbacks of every principal that lost something."""
        by_id = {p.principal_id: p for p in fresh}
        for before in previous:
            after = by_id.get(before.principal_id)
            lost = lost_actions(before, after)
            standing_lost = not before.revoked and (after is None or after.revoked)
            if lost or standing_lost:
                for callback in tuple(self._callbacks):
                    callback(before.principal_id, lost)

    def _stat(self) -> _FileStamp | None:
        """The file's stamp, or None when it does not exist."""
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            return None
        return _FileStamp(st.st_ino, st.st_mtime_ns, st.st_size)


def _revoked_version(principal: Principal, action_id: str | None) -> Principal:
    """The principal after revoking one grant or (None) everything."""
    if action_id is None:
        return replace(principal, grants=(), revoked=True)
    kept = tuple(grant for grant in principal.grants if grant.action_id != action_id)
    if len(kept) == len(principal.grants):
        raise SensoriumError("the principal holds no grant for this action", code=Code.UNKNOWN_GRANT)
    return replace(principal, grants=kept)


def _find(principals: Sequence[Principal], principal_id: str) -> Principal:
    """The principal with this id; `unknown-principal` otherwise."""
    for principal in principals:
        if principal.principal_id == principal_id:
            return principal
    raise SensoriumError("no principal with this id", code=Code.UNKNOWN_PRINCIPAL)


def _check_unique_grants(grants: Sequence[Grant]) -> None:
    """One grant per action id (transports are merged by the caller)."""
    ids = [grant.action_id for grant in grants]
    if len(set(ids)) != len(ids):
        raise SensoriumError("one grant per action id", code=Code.INVALID_INPUT)


def _parse_document(doc: Any) -> tuple[Principal, ...]:
    """Strictly parse the file's document."""
    if not isinstance(doc, dict) or set(doc) != {"schema", "principals"} or doc["schema"] != SCHEMA:
        raise _malformed("principals file has the wrong shape")
    entries = doc["principals"]
    if not isinstance(entries, list):
        raise _malformed("principals file has the wrong shape")
    principals = tuple(_parse_principal(entry) for entry in entries)
    if len({p.principal_id for p in principals}) != len(principals):
        raise _malformed("principals file repeats an id")
    return principals


def _parse_principal(entry: Any) -> Principal:
    """One principal entry."""
    required, optional = {"id", "role", "token_sha256", "grants"}, {"revoked"}
    if not isinstance(entry, dict) or not required <= set(entry) <= required | optional:
        raise _malformed("principal entry has the wrong shape")
    token_sha256, grants, revoked = entry["token_sha256"], entry["grants"], entry.get("revoked", False)
    if not isinstance(token_sha256, str) or not TOKEN_SHA256_PATTERN.fullmatch(token_sha256):
        raise _malformed("principal entry has a malformed token hash")
    if not isinstance(grants, list) or not isinstance(revoked, bool):
        raise _malformed("principal entry has the wrong shape")
    try:
        parsed = tuple(_parse_grant(grant) for grant in grants)
        _check_unique_grants(parsed)
        return Principal(
            check_principal_id(entry["id"]), check_role(entry["role"]), token_sha256, parsed, revoked
        )
    except SensoriumError as error:
        raise _malformed("principal entry is invalid") from error


def _parse_grant(entry: Any) -> Grant:
    """One grant entry."""
    if not isinstance(entry, dict) or not {"action_id"} <= set(entry) <= {"action_id", "transports"}:
        raise _malformed("grant entry has the wrong shape")
    transports = entry.get("transports")
    if transports is not None and not (
        isinstance(transports, list) and all(isinstance(t, str) for t in transports)
    ):
        raise _malformed("grant transports must be a list of strings")
    if not isinstance(entry["action_id"], str):
        raise _malformed("grant entry has the wrong shape")
    return make_grant(entry["action_id"], transports)


def _document(principals: Sequence[Principal]) -> dict[str, Any]:
    """The file's document for these principals (hashes only)."""
    return {"schema": SCHEMA, "principals": [_principal_entry(p) for p in principals]}


def _principal_entry(principal: Principal) -> dict[str, Any]:
    """One principal as stored."""
    entry: dict[str, Any] = {
        "id": principal.principal_id,
        "role": principal.role,
        "token_sha256": principal.token_sha256,
        "grants": [_grant_entry(grant) for grant in principal.grants],
    }
    if principal.revoked:
        entry["revoked"] = True
    return entry


def _grant_entry(grant: Grant) -> dict[str, Any]:
    """One grant as stored."""
    if grant.transports is None:
        return {"action_id": grant.action_id}
    return {"action_id": grant.action_id, "transports": list(grant.transports)}


def _save(data_dir: Path, principals: Sequence[Principal]) -> None:
    """Atomically replace the file: temp file (0600) + fsync + rename + directory fsync."""
    path = principals_path(data_dir)
    body = (json.dumps(_document(principals), indent=2) + "\n").encode("utf-8")
    temp = path.with_name(f".{FILE_NAME}.{secrets.token_hex(8)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    """Hold the advisory lock around a read-modify-write of the file (creating the data dir 0700)."""
    directory = Path(data_dir)
    make_private_dir(directory)
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _malformed(reason: str) -> SensoriumError:
    """A refusal of the file that names the reason, never its content."""
    return SensoriumError(reason, code=Code.PRINCIPALS_MALFORMED)
