"""(device, inode) -> path, for the ``file`` label: from the target processes' open files
(/proc/PID/fd, one stat each: metadata only, no page is read) and mappings (/proc/PID/maps
gives device and inode itself), and the --file paths.

A key the probe reports that no target has open or mapped (the file was closed) keeps the
path it was last seen with; one never seen is labelled ``dev:MAJ:MIN:ino:N``, and inode 0
(a call that found no page and whose fd had no earlier read) ``unknown``.  A key seen for the
first time is looked up at once (the exporter names new keys every second, while their
reader is alive); one not found is looked up again at most every ``min_rescan_s``.  A name,
once a path, never changes (one series per file); a fallback name becomes the path when it is
found (the series is then continued under the path).
"""
from __future__ import annotations

import time

from engramprof.host.files import open_regular_files

UNKNOWN = "unknown"


def _maps_keys(pid: int) -> dict[tuple[int, int], str]:
    out = {}
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6 or parts[4] == "0":
                    continue
                major, minor = (int(x, 16) for x in parts[3].split(":"))
                out[((major << 20) | minor, int(parts[4]))] = parts[5].strip()
    except (OSError, ValueError):
        pass
    return out


class FileNames:
    def __init__(self, selection, pids_now, min_rescan_s: float = 5.0):
        self.pids_now = pids_now  # () -> iterable of target tgids
        self.paths: dict[tuple[int, int], str] = {(d, i): p for d, i, p in selection.files}
        self.min_rescan_s = min_rescan_s
        self._last_scan = 0.0
        self._tried: set[tuple[int, int]] = set()

    def rescan(self) -> None:
        self._last_scan = time.monotonic()
        for pid in self.pids_now():
            self.paths.update(_maps_keys(pid))
            self.paths.update(open_regular_files(pid))

    def name(self, dev: int, ino: int) -> str:
        if ino == 0:
            return UNKNOWN
        key = (dev, ino)
        stale = time.monotonic() - self._last_scan >= self.min_rescan_s
        if key not in self.paths and (key not in self._tried or stale):
            self._tried.add(key)  # a key seen for the first time: scan now, while its reader has it open
            self.rescan()
        return self.paths.get(key) or f"dev:{dev >> 20}:{dev & 0xFFFFF}:ino:{ino}"
