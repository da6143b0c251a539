"""A process streaming a large file through the page cache (``lab scenario boot-stream``).

    python -m engramprof.lab.streamer PATH

Reads PATH from start to end in 1 MiB chunks again and again, touching each chunk twice (a
checkpoint parsed, then copied, as a model server loads one at boot: its pages reach the
active list as a hot table's do).  Ends on SIGTERM / SIGINT or when its parent exits, and
prints ``{"passes": N}`` on stdout.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m engramprof.lab.streamer PATH", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    parent = os.getppid()
    try:
        fd = os.open(args[0], os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        print(f"streamer: {args[0]}: {exc.strerror}", file=sys.stderr)
        return 1
    buf = bytearray(1 << 20)
    passes = 0
    try:
        while not stop.is_set() and os.getppid() == parent:
            off = 0
            while not stop.is_set():
                n = os.preadv(fd, [buf], off)
                if n <= 0:
                    break
                os.preadv(fd, [buf], off)  # the second touch
                off += n
            passes += 1
    finally:
        os.close(fd)
        print(json.dumps({"passes": passes}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
