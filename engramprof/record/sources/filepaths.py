"""Paths for read events that carry the kernel's (device, inode) of the file they read.

:class:`FilePathEnricher` (io_uring, libaio and syscall read events) names each identity from
the target's open files, its mappings, the ``--file`` selection and the kernel's name at the
open; an identity none of them names keeps path "".
"""
from __future__ import annotations

import time

import numpy as np

from engramprof.host.files import file_identities, open_regular_files
from engramprof.record.decode import ReadBatch
from engramprof.record.sources.faults import _distinct_files, read_maps
from engramprof.record.strings import Interner


class FilePathEnricher:
    """Adds ``path`` and ``path_stale`` (false) from a (device, inode) the kernel took at the
    read: the names the process's open files and mappings give that identity now, and the
    ``--file`` selection's.  An identity they do not name is looked up again (a new walk of
    /proc/PID/fd and maps) at most once per ``UNNAMED_TTL_NS``; never found: path ""."""

    UNNAMED_TTL_NS = 1_000_000_000

    def __init__(self, pid: int, paths: Interner, known: dict | None = None, proc_root: str = "/proc",
                 names=None):
        self.pid = pid
        self.paths = paths
        self.proc_root = proc_root
        #: names(pid, dev, ino) -> path | None: the kernel's name at an open (the file-name
        #: source, :meth:`Recording.kernel_file_name`), asked before /proc is walked again
        self.names = names
        self.kernel_named = 0
        self.files: dict[tuple[int, int], tuple[str, bool]] = dict(known or {})
        self._unnamed: dict[tuple[int, int], int] = {}
        self._named: set[str] = set()
        self.rereads = 0
        self.refresh()

    def refresh(self) -> None:
        """The identities of the process's open files and mappings now."""
        for (dev, ino), link in open_regular_files(self.pid, self.proc_root).items():
            self._name(dev, ino, link)
        for _s, _e, _off, dev, ino, path in read_maps(self.pid):
            if path.startswith("/"):
                self._name(dev, ino, path)

    def _name(self, dev: int, ino: int, path: str) -> None:
        self.files.setdefault((dev, ino), (path, False))
        if path in self._named:
            return
        self._named.add(path)
        try:  # overlayfs: the request reads the layer's inode; the path names the overlay's
            for i in file_identities(path):
                self.files.setdefault((i.dev, i.ino), (path, False))
        except OSError:
            pass

    def enrich(self, batch: ReadBatch) -> None:
        recs = batch.recs
        pairs, inv = _distinct_files(recs["dev"], recs["ino"])
        unknown = [p for p in pairs if p not in self.files]
        if unknown and self.names is not None:
            for p in unknown:
                name = self.names(self.pid, *p)
                if name:
                    self.files[p] = (name, False)
                    self.kernel_named += 1
            unknown = [p for p in unknown if p not in self.files]
        if unknown:
            now = time.monotonic_ns()
            if any(now - self._unnamed.get(p, -self.UNNAMED_TTL_NS) >= self.UNNAMED_TTL_NS for p in unknown):
                self.rereads += 1
                self.refresh()
                for p in unknown:
                    if p not in self.files:
                        self._unnamed[p] = now
        codes = np.array([self.paths.code(self.files.get(p, ("", False))[0]) for p in pairs], dtype=np.int32)
        batch.cols["path"] = codes[inv]
        batch.cols["path_stale"] = np.zeros(len(inv), dtype=bool)
