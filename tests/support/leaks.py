"""What a test leaves behind: tasks still pending on its event loop, threads and child processes alive."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SETTLE_SECONDS = 2.0  # threads, processes and tasks that are already ending get this long


@dataclass(frozen=True)
class Snapshot:
    """The threads and child processes alive at one moment."""

    threads: frozenset[threading.Thread]
    children: frozenset[int]


def snapshot() -> Snapshot:
    """The threads and (non-zombie) child processes of this process now."""
    return Snapshot(frozenset(threading.enumerate()), frozenset(child_processes()))


def child_processes() -> set[int]:
    """Pids of this process's children that still run (zombies are exited, only not yet reaped)."""
    me, found = os.getpid(), set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == me and state != "Z":
            found.add(int(entry.name))
    return found


def pending_tasks(loop: asyncio.AbstractEventLoop | None) -> set[asyncio.Task[object]]:
    """Tasks of `loop` that have not finished."""
    if loop is None or loop.is_closed():
        return set()
    return {task for task in asyncio.all_tasks(loop) if not task.done()}


def leaks(before: Snapshot, loop: asyncio.AbstractEventLoop | None) -> list[str]:
    """Everything started since `before` that is still alive after a short settle, one line each."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        tasks = pending_tasks(loop)
        threads = {t for t in threading.enumerate() if t not in before.threads and t.is_alive()}
        children = child_processes() - before.children
        if not (tasks or threads or children) or time.monotonic() > deadline:
            break
        if tasks and loop is not None:
            loop.run_until_complete(asyncio.sleep(0.02))  # real peer: cancelled tasks end; the loop checks
        else:
            time.sleep(0.02)  # real peer: threads and child processes end; the condition ends it
    return (
        [f"task {task.get_name()}: {task.get_coro()!r}" for task in tasks]
        + [f"thread {thread.name} (daemon={thread.daemon})" for thread in threads]
        + [f"child process {pid}: {_command(pid)}" for pid in sorted(children)]
    )


def _command(pid: int) -> str:
    try:
        command = (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    return command.replace(b"\0", b" ").decode(errors="replace")
