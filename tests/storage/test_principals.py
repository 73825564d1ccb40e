"""`principals.json`: hashes only, atomic 0600 writes, strict parsing, and the live directory's reloads."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from connector.core.authority import Grant, hash_token
from connector.errors import SensoriumError
from connector.storage.principals import (
    PrincipalDirectory,
    add_principal,
    list_principals,
    load_principals,
    principals_path,
    revoke,
)

SCAN = "device.discovery.scan"
REDACT = "whisper.redaction.prepare"


def _codes(error: pytest.ExceptionInfo[SensoriumError]) -> str:
    return error.value.code


def test_add_stores_only_the_hash(tmp_path: Path) -> None:
    token = add_principal(tmp_path, "alice", "caller", [Grant(SCAN, ("ble",)), Grant(REDACT)])
    raw = principals_path(tmp_path).read_text()
    assert token not in raw
    assert hash_token(token) in raw
    doc = json.loads(raw)
    assert doc == {
        "schema": "sensorium-principals.v1",
        "principals": [
            {
                "id": "alice",
                "role": "caller",
                "token_sha256": hash_token(token),
                "grants": [{"action_id": SCAN, "transports": ["ble"]}, {"action_id": REDACT}],
            }
        ],
    }
    assert len(token) >= 43  # 32 random bytes, base64url


def test_file_is_private_and_no_temp_files_remain(tmp_path: Path) -> None:
    add_principal(tmp_path / "data", "alice", "caller", [Grant(SCAN)])
    add_principal(tmp_path / "data", "bob", "caller", [Grant(SCAN)])
    path = principals_path(tmp_path / "data")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o700
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [
        "principals.json",
        "principals.json.lock",
    ]


def test_tokens_are_unique_and_authenticate(tmp_path: Path) -> None:
    tokens = {add_principal(tmp_path, f"p{i}", "caller", [Grant(SCAN)]) for i in range(5)}
    assert len(tokens) == 5
    directory = PrincipalDirectory(tmp_path)
    assert {directory.authenticate(t).principal_id for t in tokens} == {f"p{i}" for i in range(5)}


def test_duplicate_id_is_refused_and_file_unchanged(tmp_path: Path) -> None:
    add_principal(tmp_path, "alice", "caller", [Grant(SCAN)])
    before = principals_path(tmp_path).read_bytes()
    with pytest.raises(SensoriumError) as refused:
        add_principal(tmp_path, "alice", "operator")
    assert _codes(refused) == "principal-exists"
    assert principals_path(tmp_path).read_bytes() == before


@pytest.mark.parametrize(
    ("pid", "role", "grants", "code"),
    [
        ("bad id", "caller", [], "invalid-input"),
        ("alice", "admin", [], "invalid-input"),
        ("ops", "operator", [Grant(SCAN)], "invalid-input"),
        ("alice", "caller", [Grant(SCAN), Grant(SCAN, ("ble",))], "invalid-input"),
    ],
)
def test_add_refusals(tmp_path: Path, pid: str, role: str, grants: list[Grant], code: str) -> None:
    with pytest.raises(SensoriumError) as refused:
        add_principal(tmp_path, pid, role, grants)
    assert _codes(refused) == code
    assert not principals_path(tmp_path).exists()


def test_revoke_one_grant_then_everything(tmp_path: Path) -> None:
    token = add_principal(tmp_path, "alice", "caller", [Grant(SCAN), Grant(REDACT)])
    assert revoke(tmp_path, "alice", SCAN) == frozenset({SCAN})
    (alice,) = list_principals(tmp_path)
    assert alice.grants == (Grant(REDACT),) and not alice.revoked
    assert revoke(tmp_path, "alice") == frozenset({REDACT})
    (alice,) = list_principals(tmp_path)
    assert alice.grants == () and alice.revoked
    with pytest.raises(SensoriumError) as refused:
        PrincipalDirectory(tmp_path).authenticate(token)
    assert _codes(refused) == "unauthenticated"


def test_revoke_refusals(tmp_path: Path) -> None:
    add_principal(tmp_path, "alice", "caller", [Grant(SCAN)])
    with pytest.raises(SensoriumError) as unknown:
        revoke(tmp_path, "nobody")
    assert _codes(unknown) == "unknown-principal"
    with pytest.raises(SensoriumError) as no_grant:
        revoke(tmp_path, "alice", REDACT)
    assert _codes(no_grant) == "unknown-grant"


def test_missing_file_means_no_principals(tmp_path: Path) -> None:
    assert load_principals(tmp_path) == ()


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"\xff\xfe",
        b"[]",
        b'{"schema": "sensorium-principals.v2", "principals": []}',
        b'{"schema": "sensorium-principals.v1", "principals": {}}',
        b'{"schema": "sensorium-principals.v1", "principals": [], "extra": 1}',
        b'{"schema": "sensorium-principals.v1", "principals": [{"id": "a", "role": "caller", "grants": []}]}',
        b'{"schema": "sensorium-principals.v1", "principals": [{"id": "a", "role": "caller", '
        b'"token_sha256": "CANARY-not-a-hash", "grants": []}]}',
        b'{"schema": "sensorium-principals.v1", "principals": [{"id": "a", "role": "root", '
        b'"token_sha256": "' + b"0" * 64 + b'", "grants": []}]}',
        b'{"schema": "sensorium-principals.v1", "principals": [{"id": "a", "role": "caller", '
        b'"token_sha256": "' + b"0" * 64 + b'", "grants": [{"action_id": "x", "transports": ["wifi"]}]}]}',
        b'{"schema": "sensorium-principals.v1", "principals": [{"id": "a", "role": "caller", '
        b'"token_sha256": "' + b"0" * 64 + b'", "grants": [], "secret": "CANARY"}]}',
    ],
)
def test_malformed_file_is_refused_without_echo(tmp_path: Path, content: bytes) -> None:
    principals_path(tmp_path).write_bytes(content)
    with pytest.raises(SensoriumError) as refused:
        load_principals(tmp_path)
    assert _codes(refused) == "principals-malformed"
    assert "CANARY" not in str(refused.value)


def test_repeated_ids_in_file_are_refused(tmp_path: Path) -> None:
    entry = {"id": "a", "role": "caller", "token_sha256": "0" * 64, "grants": []}
    doc = {"schema": "sensorium-principals.v1", "principals": [entry, entry]}
    principals_path(tmp_path).write_text(json.dumps(doc))
    with pytest.raises(SensoriumError):
        load_principals(tmp_path)


# -- the live directory ---------------------------------------------------------------------------------


def _recording(directory: PrincipalDirectory) -> list[tuple[str, frozenset[str]]]:
    seen: list[tuple[str, frozenset[str]]] = []
    directory.on_revoked(lambda pid, lost: seen.append((pid, lost)))
    return seen


def test_reload_is_a_no_op_while_the_file_is_unchanged(tmp_path: Path) -> None:
    add_principal(tmp_path, "alice", "caller", [Grant(SCAN)])
    directory = PrincipalDirectory(tmp_path)
    assert directory.reload_if_changed() is False
    assert directory.reload_if_changed() is False


def test_reload_picks_up_an_external_revoke_and_fires(tmp_path: Path) -> None:
    token = add_principal(tmp_path, "alice", "caller", [Grant(SCAN), Grant(REDACT)])
    add_principal(tmp_path, "bob", "caller", [Grant(SCAN)])
    directory = PrincipalDirectory(tmp_path)
    seen = _recording(directory)
    revoke(tmp_path, "alice", SCAN)  # what `principals revoke` does from another process
    assert directory.reload_if_changed() is True
    assert seen == [("alice", frozenset({SCAN}))]
    alice = directory.authenticate(token)
    assert alice.grants == (Grant(REDACT),)
    assert directory.reload_if_changed() is False
    assert seen == [("alice", frozenset({SCAN}))]


def test_reload_picks_up_new_principals_without_firing(tmp_path: Path) -> None:
    add_principal(tmp_path, "alice", "caller", [Grant(SCAN)])
    directory = PrincipalDirectory(tmp_path)
    seen = _recording(directory)
    token = add_principal(tmp_path, "bob", "caller", [Grant(SCAN)])
    assert directory.reload_if_changed()
    assert directory.authenticate(token).principal_id == "bob"
    assert seen == []


def test_hand_edit_narrowing_transports_fires(tmp_path: Path) -> None:
    add_principal(tmp_path, "alice", "caller", [Grant(SCAN)])
    directory = PrincipalDirectory(tmp_path)
    seen = _recording(directory)
    doc = json.loads(principals_path(tmp_path).read_text())
    doc["principals"][0]["grants"][0]["transports"] = ["mdns"]
    principals_path(tmp_path).write_text(json.dumps(doc))
    assert directory.reload_if_changed()
    assert seen == [("alice", frozenset({SCAN}))]


def test_deleting_the_file_revokes_everyone(tmp_path: Path) -> None:
    token = add_principal(tmp_path, "alice", "caller", [Grant(SCAN)])
    add_principal(tmp_path, "ops", "operator")
    directory = PrincipalDirectory(tmp_path)
    seen = _recording(directory)
    principals_path(tmp_path).unlink()
    assert directory.reload_if_changed()
    assert sorted(seen) == [("alice", frozenset({SCAN})), ("ops", frozenset())]
    with pytest.raises(SensoriumError):
        directory.authenticate(token)


def test_revoke_now_applies_at_once_and_fires_once(tmp_path: Path) -> None:
    token = add_principal(tmp_path, "alice", "caller", [Grant(SCAN), Grant(REDACT)])
    directory = PrincipalDirectory(tmp_path)
    seen = _recording(directory)
    assert directory.revoke_now("alice", REDACT) == frozenset({REDACT})
    assert directory.get("alice") is not None
    assert directory.authenticate(token).grants == (Grant(SCAN),)
    assert directory.revoke_now("alice") == frozenset({SCAN})
    assert directory.reload_if_changed() is False
    assert seen == [("alice", frozenset({REDACT})), ("alice", frozenset({SCAN}))]
    with pytest.raises(SensoriumError):
        directory.authenticate(token)


def test_revoking_an_operator_fires_and_locks_it_out(tmp_path: Path) -> None:
    token = add_principal(tmp_path, "ops", "operator")
    directory = PrincipalDirectory(tmp_path)
    seen = _recording(directory)
    directory.revoke_now("ops")
    assert seen == [("ops", frozenset())]
    with pytest.raises(SensoriumError):
        directory.authenticate(token)


def test_undo_unregisters_the_callback(tmp_path: Path) -> None:
    add_principal(tmp_path, "alice", "caller", [Grant(SCAN)])
    directory = PrincipalDirectory(tmp_path)
    seen: list[str] = []
    undo = directory.on_revoked(lambda pid, lost: seen.append(pid))
    undo()
    undo()
    directory.revoke_now("alice")
    assert seen == []


def test_malformed_reload_fails_closed_and_recovers(tmp_path: Path) -> None:
    token = add_principal(tmp_path, "alice", "caller", [Grant(SCAN), Grant(REDACT)])
    directory = PrincipalDirectory(tmp_path)
    seen = _recording(directory)
    good = principals_path(tmp_path).read_bytes()
    principals_path(tmp_path).write_bytes(b"{broken")
    assert directory.reload_if_changed()
    assert not directory.healthy
    with pytest.raises(SensoriumError):
        directory.authenticate(token)  # nobody authenticates while the file is refused
    assert seen == []
    doc = json.loads(good)
    doc["principals"][0]["grants"] = [{"action_id": REDACT}]
    principals_path(tmp_path).write_text(json.dumps(doc))
    os.utime(principals_path(tmp_path))
    assert directory.reload_if_changed()
    assert directory.healthy
    assert directory.authenticate(token).principal_id == "alice"
    assert seen == [("alice", frozenset({SCAN}))]  # diffed against the last good version
