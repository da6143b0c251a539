"""A separate process that drops a file from the page cache every N ms (``lab scenario dropper``).

    python -m engramprof.lab.dropper --every-ms 200 [--drop-caches] [--count-file F] PATH

The default drops only PATH (``posix_fadvise(POSIX_FADV_DONTNEED)``, which never reads a
page); ``--drop-caches`` writes ``1`` to /proc/sys/vm/drop_caches instead (the whole
machine's clean page cache: what a cron job of the public record does; root only).  It ends
on SIGTERM / SIGINT or when its parent exits, and prints ``{"drops": N}`` on stdout;
``--count-file`` keeps N in that (new) file after every drop, for the scenario's evidence;
``--log`` (a new file) gets one line a drop, ``MONOTONIC_NS CACHED_BEFORE CACHED_AFTER``: the
file's cached pages by cachestat(2) right before and after it (the lab's own count of the pages
each drop removed, to check the eviction probe against; never a page read).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from engramprof.host.cachestat import cachestat
from engramprof.lab.helper_loop import HelperLoop

DROP_CACHES = "/proc/sys/vm/drop_caches"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="engramprof.lab.dropper")
    ap.add_argument("--every-ms", type=float, required=True)
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--count-file")
    ap.add_argument("--log")
    ap.add_argument("path")
    a = ap.parse_args(argv)
    if not a.every_ms > 0:
        print("dropper: --every-ms must be positive", file=sys.stderr)
        return 2
    loop = HelperLoop("dropper", "drops")
    if not loop.open(a.path, a.count_file):
        return 1
    log = None
    if a.log:
        try:
            log = os.fdopen(os.open(a.log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600),
                            "w", buffering=1)
        except OSError as exc:
            print(f"dropper: {a.log}: {exc.strerror}", file=sys.stderr)
            loop.close()
            return 1
    with loop:  # closes the files and prints the count, also after an error
        while loop.wait(a.every_ms / 1000):
            before = _cached(loop.fd) if log else None
            if a.drop_caches:
                with open(DROP_CACHES, "w") as f:
                    f.write("1")
            else:
                os.posix_fadvise(loop.fd, 0, 0, os.POSIX_FADV_DONTNEED)
            if log:
                log.write(f"{time.monotonic_ns()} {before} {_cached(loop.fd)}\n")
            loop.counted()
    if log:
        log.close()
    return 0


def _cached(fd: int) -> int:
    """The file's pages in the page cache now (cachestat(2); -1 where the kernel lacks it)."""
    try:
        return int(cachestat(fd).nr_cache)
    except OSError:
        return -1


if __name__ == "__main__":
    sys.exit(main())
