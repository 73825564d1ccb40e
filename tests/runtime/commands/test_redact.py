"""The redaction program: what it replaces, what it leaves alone, and how it refuses bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from connector.actions.redact import parse_request, redact

CASES = [
    ("mail jane.doe+tag@example.co.uk now", "mail [email] now", 1, 0),
    ("a@b.io, x_y@foo-bar.example.org.", "[email], [email].", 2, 0),
    ("üser@exämple.com", "[email]", 1, 0),
    ("call +49 30 1234567 today", "call [phone] today", 0, 1),
    ("+1 (555) 123-4567", "[phone]", 0, 1),
    ("+447911123456.", "[phone].", 0, 1),
    ("tel:+33 1 23 45 67 89;", "tel:[phone];", 0, 1),
    ("(555) 123-4567 / 555-123-4567 / 555 123 4567", "[phone] / [phone] / [phone]", 0, 3),
    ("local 555-1234", "local [phone]", 0, 1),
    ("030 1234567, 0171-1234567, (030) 123 45 67, 020 7946 0958", "[phone], [phone], [phone], [phone]", 0, 4),
    ("both: bob@example.com +44 20 7946 0958", "both: [email] [phone]", 1, 1),
]

UNTOUCHED = [
    "order 123456789 shipped",
    "in 2023 2024 2025",
    "ip 192.168.100.200 and pi 3.14159265",
    "dates 01-02-2024 and 2024-01-15",
    "short 12-34 and 555-12",
    "+12345",
    "user@localhost and x@y",
    "nothing here",
    "",
]


@pytest.mark.parametrize(("text", "expected", "emails", "phones"), CASES)
def test_redacts(text: str, expected: str, emails: int, phones: int) -> None:
    assert redact(text) == (expected, {"email": emails, "phone": phones})


@pytest.mark.parametrize("text", UNTOUCHED)
def test_leaves_other_text_alone(text: str) -> None:
    assert redact(text) == (text, {"email": 0, "phone": 0})


def test_phone_digits_inside_an_email_count_as_email() -> None:
    assert redact("+4930123456@example.com") == ("[email]", {"email": 1, "phone": 0})


def test_parse_request() -> None:
    assert parse_request(b'{"text": "hi"}') == "hi"


def run(stdin: bytes, repo_root: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "connector.actions.redact"],
        input=stdin,
        capture_output=True,
        cwd=repo_root,
        timeout=60,
        check=False,
    )


@pytest.mark.realtime  # a `python -m connector.actions.redact` process
def test_program_round_trip(repo_root: Path) -> None:
    done = run(json.dumps({"text": "ring 0171-1234567 or mail é@example.org"}).encode(), repo_root)
    assert done.returncode == 0 and done.stderr == b""
    assert json.loads(done.stdout) == {
        "text": "ring [phone] or mail [email]",
        "redactions": {"email": 1, "phone": 1},
    }


@pytest.mark.parametrize(
    "stdin",
    [
        b"CANARY not json",
        b"\xffCANARY",
        b'["CANARY"]',
        b'{"text": 42, "note": "CANARY"}',
        b'{"text": "CANARY", "extra": true}',
        b'{"txt": "CANARY"}',
        b'{"text": ["CANARY"]}',
        json.dumps({"text": "CANARY" + "x" * 70000}).encode(),
        b"",
    ],
)
@pytest.mark.realtime  # a `python -m connector.actions.redact` process
def test_program_refuses_bad_input_without_echo(stdin: bytes, repo_root: Path) -> None:
    done = run(stdin, repo_root)
    assert done.returncode == 2
    assert done.stdout == b""
    err = done.stderr.decode()
    assert len(err.strip().splitlines()) == 1
    assert "CANARY" not in err
