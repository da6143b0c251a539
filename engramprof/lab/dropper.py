"""A separate process that drops a file from the page cache every N ms (``lab scenario dropper``).

    python -m engramprof.lab.dropper --every-ms 200 [--drop-caches] [--count-file F] PATH

The default drops only PATH (``posix_fadvise(POSIX_FADV_DONTNEED)``, which never reads a
page); ``--drop-caches`` writes ``1`` to /proc/sys/vm/drop_caches instead (the whole
machine's clean page cache: what a cron job of the public record does; root only).  It ends
on SIGTERM / SIGINT or when its parent exits, and prints ``{"drops": N}`` on stdout;
``--count-file`` keeps N in that (new) file after every drop, for the scenario's evidence.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading

DROP_CACHES = "/proc/sys/vm/drop_caches"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="engramprof.lab.dropper")
    ap.add_argument("--every-ms", type=float, required=True)
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--count-file")
    ap.add_argument("path")
    a = ap.parse_args(argv)
    if not a.every_ms > 0:
        print("dropper: --every-ms must be positive", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    parent = os.getppid()
    try:
        fd = os.open(a.path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        print(f"dropper: {a.path}: {exc.strerror}", file=sys.stderr)
        return 1
    drops = 0
    count_fd = None
    if a.count_file:
        try:
            count_fd = os.open(a.count_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            print(f"dropper: {a.count_file}: {exc.strerror}", file=sys.stderr)
            return 1
    try:
        while not stop.wait(a.every_ms / 1000) and os.getppid() == parent:
            if a.drop_caches:
                with open(DROP_CACHES, "w") as f:
                    f.write("1")
            else:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            drops += 1
            if count_fd is not None:
                os.pwrite(count_fd, b"%-20d" % drops, 0)
    finally:
        os.close(fd)
        if count_fd is not None:
            os.close(count_fd)
        print(json.dumps({"drops": drops}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
