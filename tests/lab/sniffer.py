"""A subscriber to `>` as a user allowed to (tests only): every message, headers included, as JSON lines."""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import nats
from nats.aio.msg import Msg


async def main(urls: str, seed: str, out_path: str) -> None:
    """Write each message's subject, headers and payload until SIGTERM."""
    nc = await nats.connect(servers=urls.split(","), nkeys_seed=seed, max_reconnect_attempts=-1)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    with open(out_path, "a", encoding="utf-8") as out:

        async def on_message(msg: Msg) -> None:
            data = msg.data.decode("utf-8", errors="replace")
            out.write(json.dumps({"subject": msg.subject, "headers": msg.headers, "data": data}) + "\n")
            out.flush()

        await nc.subscribe(">", cb=on_message)
        await nc.flush()
        out.write(json.dumps({"subject": "sniffer.ready"}) + "\n")
        out.flush()
        await stop.wait()
    await nc.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
