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
import os
import sys

from engramprof.lab.helper_loop import HelperLoop

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
    loop = HelperLoop("dropper", "drops")
    if not loop.open(a.path, a.count_file):
        return 1
    with loop:  # closes the files and prints the count, also after an error
        while loop.wait(a.every_ms / 1000):
            if a.drop_caches:
                with open(DROP_CACHES, "w") as f:
                    f.write("1")
            else:
                os.posix_fadvise(loop.fd, 0, 0, os.POSIX_FADV_DONTNEED)
            loop.counted()
    return 0


if __name__ == "__main__":
    sys.exit(main())
