"""Tiny programs the runner tests execute (never imported by the connector).

Usage: `python3 programs.py MODE [ARGS...]`
- `sleep MARKER SECONDS`: write the pid to MARKER, then sleep (SIGTERM ends it as usual);
- `ignore-term MARKER`: survive SIGTERM (noting each in MARKER.term), write the pid to MARKER, then sleep
  until SIGKILL;
- `fail CANARY`: write CANARY to stderr and exit 3;
- `flood BYTES`: write that many bytes of JSON-looking output to stdout;
- `echo`: write back the JSON read on stdin, wrapped as {"got": ...};
- `stderr-flood BYTES`: write that many bytes to stderr, then `{"ok": true}` to stdout;
- `nan`: print NaN (not JSON, taken as text);
- `binary`: write bytes that are not UTF-8.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def _mark(path: str) -> None:
    temp = Path(path + ".tmp")
    temp.write_text(str(os.getpid()))
    temp.replace(path)


def main(mode: str, args: list[str]) -> int:
    if mode == "sleep":
        _mark(args[0])
        time.sleep(float(args[1]))  # real peer: the scripted program's own run time
        print(json.dumps({"slept": True}))
    elif mode == "ignore-term":
        signal.signal(signal.SIGTERM, lambda *_: _mark(args[0] + ".term"))
        _mark(args[0])
        while True:
            time.sleep(1)  # real peer: the scripted program's own run time
    elif mode == "fail":
        sys.stderr.write(args[0] + "\n")
        return 3
    elif mode == "flood":
        sys.stdout.write("[" + "1," * (int(args[0]) // 2) + "1]")
    elif mode == "echo":
        print(json.dumps({"got": json.loads(sys.stdin.read())}))
    elif mode == "stderr-flood":
        sys.stderr.write("e" * int(args[0]))
        print(json.dumps({"ok": True}))
    elif mode == "nan":
        print("NaN")
    elif mode == "binary":
        sys.stdout.buffer.write(b"\xff\xfe\x00")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
