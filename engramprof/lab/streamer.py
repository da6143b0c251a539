"""A process streaming a large file through the page cache (``lab scenario boot-stream``).

    python -m engramprof.lab.streamer PATH [COUNT_FILE]

Reads PATH from start to end in 1 MiB chunks again and again, touching each chunk twice (a
checkpoint parsed, then copied, as a model server loads one at boot: its pages reach the
active list as a hot table's do).  Ends on SIGTERM / SIGINT or when its parent exits, and
prints ``{"passes": N}`` on stdout; COUNT_FILE (new) keeps N after every pass.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2):
        print("usage: python -m engramprof.lab.streamer PATH [COUNT_FILE]", file=sys.stderr)
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
    count_fd = None
    if len(args) == 2:
        try:
            count_fd = os.open(args[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            print(f"streamer: {args[1]}: {exc.strerror}", file=sys.stderr)
            return 1
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
            if count_fd is not None:
                os.pwrite(count_fd, b"%-20d" % passes, 0)
    finally:
        os.close(fd)
        if count_fd is not None:
            os.close(count_fd)
        print(json.dumps({"passes": passes}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
