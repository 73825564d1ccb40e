"""`whisper.redaction.prepare`: replace e-mail addresses and phone numbers in a text.

Run as `python -m connector.actions.redact`: reads `{"text": str}` as JSON on stdin, writes
`{"text": <redacted>, "redactions": {"email": n, "phone": n}}` on stdout. Bad input exits 2 with a
one-line reason on stderr that never repeats the input.

What counts as a phone number (7 to 15 digits, separated only by spaces, dashes or parentheses):
- international: `+CC` then digit groups (`+49 30 1234567`, `+1 (555) 123-4567`, `+447911123456`);
- North American: `(555) 123-4567`, `555-123-4567`, `555 123 4567`, local `555-1234`;
- national with a trunk 0: `030 1234567`, `0171-1234567`, `(030) 123 45 67`, `020 7946 0958`.
Bare digit runs without `+`, a trunk 0 or a separator layout above (order numbers, years, IP addresses,
decimals) are left alone, and so are date-shaped matches such as `01-02-2024`.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

EMAIL_TOKEN = "[email]"
PHONE_TOKEN = "[phone]"
MAX_TEXT_CHARS = 65536
EXIT_INPUT_REFUSED = 2

_LABEL = r"[^\W_](?:[\w-]*[^\W_])?"  # a domain label; letters may be non-ASCII (IDN)
_EMAIL = re.compile(rf"(?<![\w.%+-])[\w.%+-]+@{_LABEL}(?:\.{_LABEL})+")
_SEP = r"[ -]?"
_PHONE = re.compile(
    r"(?<![\w+-])(?:"
    rf"\+\d{{1,3}}(?:{_SEP}\(\d{{1,4}}\))?(?:{_SEP}\d{{1,6}}){{1,6}}"  # international
    r"|(?:\(\d{3}\) ?|\d{3}[ -])\d{3}[ -]\d{4}"  # North American
    r"|\d{3}-\d{4}"  # North American local
    rf"|(?:\(0\d{{1,4}}\)|0\d{{1,4}})(?:{_SEP}\d{{2,8}}){{1,4}}"  # national, trunk prefix 0
    r")(?![\w-])"
)
_DATE_SHAPED = re.compile(r"\d{1,2}[ -]\d{1,2}[ -]\d{2,4}")


def redact(text: str) -> tuple[str, dict[str, int]]:
    """The redacted text and how many e-mail addresses and phone numbers were replaced."""
    counts = {"email": 0, "phone": 0}

    def email(_: re.Match[str]) -> str:
        counts["email"] += 1
        return EMAIL_TOKEN

    def phone(match: re.Match[str]) -> str:
        if not _is_phone(match.group(0)):
            return match.group(0)
        counts["phone"] += 1
        return PHONE_TOKEN

    return _PHONE.sub(phone, _EMAIL.sub(email, text)), counts


def _is_phone(candidate: str) -> bool:
    """Digit count within E.164 bounds and not shaped like a date."""
    digits = sum(ch.isdigit() for ch in candidate)
    return 7 <= digits <= 15 and not _DATE_SHAPED.fullmatch(candidate)


def parse_request(raw: bytes) -> str:
    """The `text` of a request; raises ValueError with a reason that never holds the input."""
    try:
        doc: Any = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError("input is not UTF-8 JSON") from None
    if not isinstance(doc, dict) or set(doc) != {"text"}:
        raise ValueError('input must be an object with exactly the key "text"')
    text = doc["text"]
    if not isinstance(text, str):
        raise ValueError('"text" must be a string')
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(f'"text" is longer than {MAX_TEXT_CHARS} characters')
    return text


def main() -> int:
    """Read the request on stdin, write the redacted document on stdout."""
    try:
        text = parse_request(sys.stdin.buffer.read())
    except ValueError as reason:
        print(f"redact: {reason}", file=sys.stderr)
        return EXIT_INPUT_REFUSED
    redacted, counts = redact(text)
    body = json.dumps({"text": redacted, "redactions": counts}, ensure_ascii=False) + "\n"
    sys.stdout.buffer.write(body.encode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
