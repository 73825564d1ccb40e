"""A node reaching its NATS system over TLS with `--nats-tls-ca` and an nkey seed (CONTRACT §15).

The CA, the server certificate (for 127.0.0.1) and the nkey user are generated at test time, never committed.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.lab.support import ClusterServer, free_port, gather, make_users, public_key
from tests.support.serving import serving

pytestmark = [pytest.mark.serve, pytest.mark.lab, pytest.mark.timeout(180)]


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def write_ca_and_server_cert(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a certificate for 127.0.0.1 signed by it: (ca.pem, server.pem, server.key)."""
    now = dt.datetime.now(dt.UTC)
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("lab test CA"))
        .issuer_name(_name("lab test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(_pem(server_key))
    return paths


def test_a_node_over_tls_with_its_ca_and_nkey(tmp_path: Path) -> None:
    ca, cert, key = write_ca_and_server_cert(tmp_path)
    seeds = make_users(tmp_path / "users")
    port = free_port()
    (tmp_path / "server.conf").write_text(
        "\n".join(
            [
                f"listen: 127.0.0.1:{port}",
                f'tls {{ cert_file: "{cert}", key_file: "{key}" }}',
                "authorization { users = [",
                f'  {{ nkey: "{public_key(seeds["node-a"])}" }}',
                f'  {{ nkey: "{public_key(seeds["sniffer"])}" }}',
                "] }",
            ]
        )
    )
    server = ClusterServer(tmp_path, port)
    server.start()
    try:
        url = f"tls://127.0.0.1:{port}"
        args: list[str | Path] = ["--simulate", "--data-dir", tmp_path / "node", "--nats", url, "--node", "a"]
        args += ["--nats-creds", seeds["node-a"], "--nats-tls-ca", ca]
        with serving(*args, log=tmp_path / "node.log", timeout=60):  # healthy: the Bus subscribed over TLS
            context = ssl.create_default_context(cafile=str(ca))
            pings = gather(url, seeds["sniffer"], "$SRV.PING.sensorium-os", tls=context)
            assert [p["metadata"]["node"] for p in pings] == ["a"]
    finally:
        server.stop()
