"""Whether a node name is live on the NATS system (CONTRACT §15: a second `serve` claiming it refuses)."""

from __future__ import annotations

import contextlib
import logging

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError

from connector.bus.node import BrokerAccess, NodeSubjects, connect_options

_log = logging.getLogger("sensorium.bus")
PROBE_TIMEOUT = 2.0


class NodeTaken(Exception):
    """Another live process answers this node's subjects."""


async def refuse_live_node(urls: str, service: str, node: str, access: BrokerAccess) -> None:
    """Raise `NodeTaken` when a process answers `<svc>.<node>.op.get`; a broker out of reach is no answer."""
    nc = NATS()
    servers = [url.strip() for url in urls.split(",")]
    try:
        await nc.connect(
            servers=servers,
            connect_timeout=PROBE_TIMEOUT,  # type: ignore[arg-type]
            max_reconnect_attempts=len(servers),  # each server of the system once
            reconnect_time_wait=0.1,  # type: ignore[arg-type]
            **connect_options(access),
        )
    except (NatsError, OSError) as error:
        _log.warning("node name not checked: NATS not reachable (%s)", type(error).__name__)
        return
    try:
        # The server answers "no responders" at once when nobody serves the subject (headers support).
        await nc.request(NodeSubjects.of(service, node).ops.get, b"", timeout=PROBE_TIMEOUT)
    except NoRespondersError:
        return
    except (NatsError, TimeoutError) as error:
        _log.warning("node name not checked: %s", type(error).__name__)
        return
    finally:
        with contextlib.suppress(NatsError):
            await nc.close()
    raise NodeTaken(f"node {node} is already served on this NATS system")
