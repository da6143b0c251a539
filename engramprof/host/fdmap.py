"""fd -> path for a traced process, from /proc/PID/fd, with history.

Each fd keeps a history of (seen_since_ns, path) so a record is resolved with the path the fd
had when the call ran, even when the fd was later reused for another file.  The table is
refreshed when a record names an fd that is unknown (at most once per drain), and on a timer.
A fd that is no longer open keeps its last path and is flagged stale: the path is the best
evidence left, not a certainty.
"""
from __future__ import annotations

import os
import time

import numpy as np


class FdResolver:
    def __init__(self, pid: int, proc_root: str = "/proc"):
        self.pid = pid
        self.fd_dir = f"{proc_root}/{pid}/fd"
        self.history: dict[int, list[tuple[int, str]]] = {}
        self.open_now: set[int] = set()
        self.refreshes = 0
        self.refresh(initial=True)

    def refresh(self, initial: bool = False) -> None:
        now = 0 if initial else time.monotonic_ns()
        try:
            names = os.listdir(self.fd_dir)
        except OSError:  # process gone: keep what we know, everything is now stale
            self.open_now = set()
            return
        seen = set()
        for name in names:
            try:
                fd = int(name)
                path = os.readlink(f"{self.fd_dir}/{name}")
            except (ValueError, OSError):
                continue
            seen.add(fd)
            hist = self.history.setdefault(fd, [])
            if not hist or hist[-1][1] != path:
                hist.append((now, path))
        self.open_now = seen
        self.refreshes += 1

    def resolve_codes(self, fds: np.ndarray, ts: np.ndarray, intern) -> tuple[np.ndarray, np.ndarray]:
        """Path codes (``intern(path) -> int``) and stale flags for records with these fds
        and entry times; vectorised per distinct fd (a process has few)."""
        n = len(fds)
        codes = np.full(n, intern(""), dtype=np.int32)
        stale = np.zeros(n, dtype=bool)
        if n == 0:
            return codes, stale
        uniq, inverse = np.unique(fds, return_inverse=True)
        if any(int(fd) not in self.history for fd in uniq):
            self.refresh()
        for i, fd in enumerate(uniq.tolist()):
            sel = inverse == i
            hist = self.history.get(fd)
            if not hist:
                stale[sel] = True
                continue
            if len(hist) == 1:
                codes[sel] = intern(hist[0][1])
            else:
                since = np.array([h[0] for h in hist], dtype=np.int64)
                idx = np.searchsorted(since, ts[sel], side="right") - 1
                hcodes = np.array([intern(h[1]) for h in hist], dtype=np.int32)
                codes[sel] = hcodes[np.clip(idx, 0, len(hist) - 1)]
            if fd not in self.open_now:
                stale[sel] = True
        return codes, stale

    def resolve(self, fds: np.ndarray, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Paths (object array) and stale flags for records with these fds and entry times."""
        names: list[str] = []
        index: dict[str, int] = {}

        def intern(p: str) -> int:
            if p not in index:
                index[p] = len(names)
                names.append(p)
            return index[p]

        codes, stale = self.resolve_codes(fds, ts, intern)
        return np.array(names, dtype=object)[codes] if len(fds) else np.empty(0, dtype=object), stale
