"""A node of a lab (CONTRACT §15): its subjects, its broker access and its operator requests.

Rules of this file:
- a node's subjects are `<svc>.<node>.op.{start,get,cancel,done}` and `<svc>.<node>.admin.{list,cancel}`;
- a broker URL that is not loopback needs both credentials and a TLS CA unless the operator says insecure,
  since request headers carry bearer tokens (the broker is part of the trust boundary);
- the operator replies carry the host's operator views only (durable metadata), refusals `{"error": ...}`.
"""

from __future__ import annotations

import ipaddress
import json
import re
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from connector.bus.messages import DEFAULT_SERVICE, Subjects, check_broker_url
from connector.errors import Code, SensoriumError

NODE_NAME: Final = re.compile(r"[a-z0-9-]{1,32}")
ADMIN_LIST_MAX: Final = 200
MICRO_NAME: Final = DEFAULT_SERVICE
_LIST_FIELDS: Final = frozenset({"status", "after", "limit"})
_CANCEL_FIELDS: Final = frozenset({"operation/id"})
_SEMVER: Final = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)")
_CREDS_MARK: Final = "-----BEGIN NATS USER JWT-----"


@dataclass(frozen=True, slots=True)
class NodeSubjects:
    """The request and announcement subjects of one node."""

    ops: Subjects
    admin_list: str
    admin_cancel: str

    @classmethod
    def of(cls, service: str, node: str) -> NodeSubjects:
        """`<svc>.<node>.op.*` and `<svc>.<node>.admin.*`."""
        prefix = f"{service}.{check_node(node)}"
        return cls(Subjects.for_service(prefix), f"{prefix}.admin.list", f"{prefix}.admin.cancel")


@dataclass(frozen=True, slots=True)
class BrokerAccess:
    """How a process authenticates to the NATS system and checks its certificate."""

    creds: Path | None = None
    tls_ca: Path | None = None
    insecure: bool = False


def check_node(name: str) -> str:
    """A node name `[a-z0-9-]{1,32}`; ValueError otherwise."""
    if not NODE_NAME.fullmatch(name):
        raise ValueError("--node takes a name of 1-32 characters a-z, 0-9 and -")
    return name


def parse_broker_urls(text: str) -> tuple[str, ...]:
    """`URL[,URL...]` of one NATS system; ValueError with a fixed reason otherwise."""
    urls = tuple(part.strip() for part in text.split(","))
    return tuple(check_broker_url(url) for url in urls)


def is_loopback(url: str) -> bool:
    """True for a URL whose host is `localhost` or a loopback address."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_access(urls: Sequence[str], access: BrokerAccess) -> None:
    """Refuse (ValueError) a non-loopback broker without both credentials and TLS, unless insecure."""
    for path, flag in ((access.creds, "--nats-creds"), (access.tls_ca, "--nats-tls-ca")):
        if path is not None and not path.is_file():
            raise ValueError(f"{flag} names no readable file")
    secured = access.creds is not None and access.tls_ca is not None
    if not secured and not access.insecure and not all(is_loopback(url) for url in urls):
        raise ValueError(
            "a NATS URL that is not loopback needs --nats-creds and --nats-tls-ca (or --nats-insecure)"
        )


def connect_options(access: BrokerAccess) -> dict[str, Any]:
    """nats-py `connect` keywords: a `.creds` file or an nkey seed file, and a TLS context on the CA."""
    options: dict[str, Any] = {}
    if access.creds is not None:
        text = access.creds.read_text(encoding="utf-8")
        key = "user_credentials" if _CREDS_MARK in text else "nkeys_seed"
        options[key] = str(access.creds)
    if access.tls_ca is not None:
        options["tls"] = ssl.create_default_context(cafile=str(access.tls_ca))
    return options


def micro_version(version: str) -> str:
    """The micro service's version: the package's when it is semantic (`1.2.3`), else `0.0.0` (metadata keeps
    the package's own)."""
    return version if _SEMVER.fullmatch(version) else "0.0.0"


def node_metadata(node: str, version: str, adapters: Mapping[str, str]) -> dict[str, str]:
    """The micro service's string metadata: node, version, transports and adapters (comma-separated)."""
    return {
        "node": node,
        "version": version,
        "transports": ",".join(sorted(adapters)),
        "adapters": ",".join(sorted(set(adapters.values()))),
    }


# ---- operator requests (pure) -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ListRequest:
    """`admin.list`: an optional status, the cursor of the previous page and a page size."""

    status: str | None = None
    after: str | None = None
    limit: int | None = None  # None: the host's default page


def _invalid(path: str, rule: str) -> SensoriumError:
    return SensoriumError(
        "invalid operator request", code=Code.INVALID_INPUT, diagnostics=[{"code": rule, "message": path}]
    )


def _body(data: bytes, allowed: frozenset[str]) -> dict[str, Any]:
    """A JSON object of the allowed fields (empty data is `{}`)."""
    if not data.strip():
        return {}
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise SensoriumError("the request is not JSON", code=Code.INVALID_JSON) from None
    if not isinstance(body, dict):
        raise _invalid("/", "not-an-object")
    extra = sorted(set(body) - allowed)
    if extra:
        raise _invalid(f"/{extra[0]}", "unknown-field")
    return body


def parse_list(data: bytes) -> ListRequest:
    """`{"status"?, "after"?, "limit"? <= 200}`; `invalid-input` naming the path otherwise."""
    body = _body(data, _LIST_FIELDS)
    for name in ("status", "after"):
        if name in body and not isinstance(body[name], str):
            raise _invalid(f"/{name}", "not-a-string")
    limit = body.get("limit")
    if limit is not None and (
        isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= ADMIN_LIST_MAX
    ):
        raise _invalid("/limit", "limit-1-to-200")
    return ListRequest(body.get("status"), body.get("after"), limit)


def parse_cancel(data: bytes) -> str:
    """`{"operation/id"}`; `invalid-input` otherwise."""
    body = _body(data, _CANCEL_FIELDS)
    op_id = body.get("operation/id")
    if not isinstance(op_id, str) or not op_id:
        raise _invalid("/operation/id", "required-string")
    return op_id


def admin_refusal(error: SensoriumError) -> dict[str, Any]:
    """A refused operator request: `{"error": sensorium-error.v1}`."""
    return {"error": error.to_document()}
