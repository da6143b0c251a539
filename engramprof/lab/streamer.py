"""A process streaming a large file through the page cache (``lab scenario boot-stream``).

    python -m engramprof.lab.streamer PATH [COUNT_FILE]

Reads PATH from start to end in 1 MiB chunks again and again, touching each chunk twice (a
checkpoint parsed, then copied, as a model server loads one at boot: its pages reach the
active list as a hot table's do).  Ends on SIGTERM / SIGINT or when its parent exits, and
prints ``{"passes": N}`` on stdout; COUNT_FILE (new) keeps N after every pass.
"""
from __future__ import annotations

import os
import sys

from engramprof.lab.helper_loop import HelperLoop


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2):
        print("usage: python -m engramprof.lab.streamer PATH [COUNT_FILE]", file=sys.stderr)
        return 2
    loop = HelperLoop("streamer", "passes")
    if not loop.open(args[0], args[1] if len(args) == 2 else None):
        return 1
    buf = bytearray(1 << 20)
    with loop:  # closes the files and prints the count, also after an error
        while not loop.stopping:
            off = 0
            while not loop.stopping:
                n = os.preadv(loop.fd, [buf], off)
                if n <= 0:
                    break
                os.preadv(loop.fd, [buf], off)  # the second touch
                off += n
            loop.counted()
    return 0


if __name__ == "__main__":
    sys.exit(main())
