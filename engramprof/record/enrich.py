"""Enrichers: columns the kernel cannot know, added to a :class:`~.decode.ReadBatch` in bulk.

Each has one job and works per distinct file of the batch (a process has few), never per
event:

* :class:`TensorEnricher`: path + offset -> ``tensor`` code and ``row`` (safetensors headers);
* :class:`PerPid`: one enricher per traced process (open files, mappings are per process).

A read event's path is a name for the file (device, inode) the kernel took at the read, never a
guess from an fd number: the path enrichers are the sources' own
(:class:`~.sources.filepaths.FilePathEnricher` for syscall and io_uring reads,
:class:`~.sources.faults.MappingPathEnricher` for faults).
"""
from __future__ import annotations

import numpy as np

from engramprof.record.decode import ReadBatch
from engramprof.record.strings import Interner
from engramprof.tables import safetensors as layout


class TensorEnricher:
    """Adds ``tensor`` (codes into ``tensors``; 0 = none) and ``row`` from the safetensors layout
    of each file the batch touches (layouts parsed once per path and cached)."""

    def __init__(self, paths: Interner, tensors: Interner, headers=None):
        self.paths = paths
        self.tensors = tensors
        # headers(path) -> (header JSON bytes, file size) | None: the bytes the file-identity
        # stage already read without touching the page cache (engramprof/target/identity.py);
        # without it the header is read from the file (a buffered read of its first pages)
        self.headers = headers
        self._layouts: dict[str, object] = {}
        self._codes: dict[int, np.ndarray] = {}

    def enrich(self, batch: ReadBatch) -> None:
        path_codes = batch.cols["path"]
        n = len(batch)
        tensor_codes = np.zeros(n, dtype=np.int32)  # code 0 is "" (no tensor)
        rows = np.full(n, -1, dtype=np.int64)
        offsets = batch.recs["offset"]
        for code in _distinct(path_codes):
            lay = self.layout_for(self.paths.values[code])
            if lay is None:
                continue
            sel = path_codes == code
            idx, r = lay.locate(offsets[sel])
            tensor_codes[sel] = self._tensor_codes(code, lay)[idx]  # idx -1 -> last entry ("")
            rows[sel] = r
        batch.cols["tensor"] = tensor_codes
        batch.cols["row"] = rows

    def _tensor_codes(self, path_code: int, lay) -> np.ndarray:
        """Tensor code of each of a layout's live tensors, then "" (for offsets outside them);
        interned once per file."""
        codes = self._codes.get(path_code)
        if codes is None:
            codes = np.array([self.tensors.code(t) for t in lay.live_names] + [self.tensors.code("")], dtype=np.int32)
            self._codes[path_code] = codes
        return codes

    def layout_for(self, path: str):
        """The safetensors layout of path, or None (not safetensors / unreadable); cached."""
        if path in self._layouts:
            return self._layouts[path]
        lay = None
        if path:
            try:
                if self.headers is not None:
                    h = self.headers(path)
                    lay = layout.parse_header(path, h[0], h[1]) if h is not None else None
                else:
                    lay = layout.load(path)
            except Exception:  # not (or no longer) a readable safetensors file
                lay = None
        self._layouts[path] = lay
        return lay


class PerPid:
    """One enricher per traced process (fd tables, mappings and /proc links are per process):
    ``make(pid)`` builds a process's enricher when its first record arrives; a batch is split by
    ``pid`` (a handful of distinct values) and each part enriched by its own process's stage.
    With one process the batch passes through whole."""

    def __init__(self, make):
        self.make = make
        self.by_pid: dict[int, object] = {}

    def of(self, pid: int):
        e = self.by_pid.get(pid)
        if e is None:
            e = self.by_pid[pid] = self.make(pid)
        return e

    def enrich(self, batch: ReadBatch) -> None:
        pids = batch.recs["pid"]
        if not len(pids):
            return
        uniq = _distinct(pids)
        if len(uniq) == 1:
            self.of(uniq[0]).enrich(batch)
            return
        out: dict[str, np.ndarray] = {}
        for pid in uniq:
            sel = pids == pid
            part = ReadBatch(batch.kind, batch.recs[sel],
                             {k: v[sel] for k, v in batch.cols.items() if isinstance(v, np.ndarray)})
            before = set(part.cols)
            self.of(pid).enrich(part)
            batch.recs[sel] = part.recs  # a stage may correct the records (exact fault pages)
            for k in set(part.cols) - before:
                v = part.cols[k]
                if k not in out:
                    out[k] = np.zeros(len(pids), dtype=v.dtype)
                out[k][sel] = v
        batch.cols.update(out)


def _distinct(values: np.ndarray) -> list[int]:
    """The distinct values of a batch's column (a pid, a path code: a handful), sorted; one
    compare when they are all one value (the common case; np.unique sorts or hashes every row)."""
    if len(values) and (values == values[0]).all():
        return [int(values[0])]
    return np.unique(values).tolist()
