"""The pure parts of a lab node (CONTRACT §15): subjects, broker access, operator requests."""

from __future__ import annotations

from pathlib import Path

import pytest

from connector.bus.node import (
    BrokerAccess,
    ListRequest,
    NodeSubjects,
    admin_refusal,
    check_access,
    check_node,
    connect_options,
    is_loopback,
    micro_version,
    node_metadata,
    parse_broker_urls,
    parse_cancel,
    parse_list,
)
from connector.errors import SensoriumError


def test_node_subjects_sit_under_the_node() -> None:
    subjects = NodeSubjects.of("sensorium-os", "rf-room")
    assert subjects.ops.start == "sensorium-os.rf-room.op.start"
    assert subjects.ops.done == "sensorium-os.rf-room.op.done"
    assert subjects.admin_list == "sensorium-os.rf-room.admin.list"
    assert subjects.admin_cancel == "sensorium-os.rf-room.admin.cancel"


@pytest.mark.parametrize("name", ["", "A", "a.b", "a*", "x" * 33, "a b"])
def test_a_node_name_outside_the_pattern_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="--node"):
        check_node(name)


def test_several_urls_of_one_system() -> None:
    assert parse_broker_urls("nats://127.0.0.1:1,nats://127.0.0.1:2") == (
        "nats://127.0.0.1:1",
        "nats://127.0.0.1:2",
    )
    with pytest.raises(ValueError):
        parse_broker_urls("nats://127.0.0.1:1,http://x")


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("nats://127.0.0.1:4222", True),
        ("nats://127.9.9.9:4222", True),
        ("nats://[::1]:4222", True),
        ("nats://localhost:4222", True),
        ("nats://10.0.0.5:4222", False),
        ("tls://nats.lab.example:4222", False),
    ],
)
def test_loopback(url: str, loopback: bool) -> None:
    assert is_loopback(url) is loopback


def test_a_remote_broker_needs_credentials_and_tls(tmp_path: Path) -> None:
    creds, ca = tmp_path / "node.creds", tmp_path / "ca.pem"
    creds.write_text("SUAEXAMPLE\n")
    ca.write_text("pem\n")
    remote = ["nats://10.0.0.5:4222"]
    for access in (BrokerAccess(), BrokerAccess(creds=creds), BrokerAccess(tls_ca=ca)):
        with pytest.raises(ValueError, match="--nats-creds and --nats-tls-ca"):
            check_access(remote, access)
    check_access(remote, BrokerAccess(creds=creds, tls_ca=ca))
    check_access(remote, BrokerAccess(insecure=True))
    check_access(["nats://127.0.0.1:4222"], BrokerAccess())
    with pytest.raises(ValueError, match="--nats-creds names no readable file"):
        check_access(remote, BrokerAccess(creds=tmp_path / "missing", tls_ca=ca))


def test_a_creds_file_or_an_nkey_seed(tmp_path: Path) -> None:
    seed, creds = tmp_path / "seed.nk", tmp_path / "user.creds"
    seed.write_text("SUAEXAMPLE\n")
    creds.write_text("-----BEGIN NATS USER JWT-----\nx\n------END NATS USER JWT------\n")
    assert connect_options(BrokerAccess(creds=seed)) == {"nkeys_seed": str(seed)}
    assert connect_options(BrokerAccess(creds=creds)) == {"user_credentials": str(creds)}
    assert connect_options(BrokerAccess()) == {}


def test_metadata_is_comma_separated_strings() -> None:
    metadata = node_metadata("a", "0.1.0", {"usb-serial": "default", "ble": "hci1", "mdns": "default"})
    assert metadata == {
        "node": "a",
        "version": "0.1.0",
        "transports": "ble,mdns,usb-serial",
        "adapters": "default,hci1",
    }


def test_list_requests() -> None:
    assert parse_list(b"") == ListRequest()
    assert parse_list(b'{"status": "running", "after": "op-1", "limit": 200}') == ListRequest(
        "running", "op-1", 200
    )
    for body, path in ((b'{"limit": 201}', "/limit"), (b'{"limit": 0}', "/limit"), (b'{"x": 1}', "/x")):
        with pytest.raises(SensoriumError) as raised:
            parse_list(body)
        assert raised.value.code == "invalid-input"
        assert raised.value.diagnostics[0]["message"] == path
    with pytest.raises(SensoriumError) as raised:
        parse_list(b"{")
    assert raised.value.code == "invalid-json"


def test_cancel_requests() -> None:
    assert parse_cancel(b'{"operation/id": "op-1"}') == "op-1"
    with pytest.raises(SensoriumError) as raised:
        parse_cancel(b"{}")
    assert raised.value.code == "invalid-input"


def test_a_refusal_is_the_error_only() -> None:
    body = admin_refusal(SensoriumError("no", code="unauthenticated"))
    assert list(body) == ["error"]
    assert body["error"]["schema"] == "sensorium-error.v1"


def test_the_micro_version_is_semantic() -> None:
    assert micro_version("0.1.0") == "0.1.0"
    assert micro_version("0.1.0.dev3+g1234") == "0.0.0"
