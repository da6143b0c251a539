"""Batch markers: an application says when each of its read batches started and ended.

Stdlib only, so a server can vendor this one file.  Usage::

    from engramprof import markers

    w = markers.MarkerWriter("/tmp/engram-markers.jsonl")
    with markers.batch(w, rows=len(offsets), step=i):
        reader.read_batch(jobs)
    w.close()

Each batch becomes one JSON line ``{"start_ns", "end_ns", "tid", ...extra}`` with
CLOCK_MONOTONIC nanoseconds (``time.monotonic_ns()``, the clock of ``bpf_ktime_get_ns``),
``tid`` the submitting thread's kernel id.  A line also carries ``python_tids`` (the kernel ids
of the interpreter's threads, ``threading.enumerate()``) whenever that set changed since the
previous line: the analysis tells Python threads from native ones (OpenMP, a library's own
pool) by it (engramprof/analysis/thread_kinds.py).  Lines are buffered and flushed at most every
``flush_s`` seconds, on :meth:`MarkerWriter.flush`, on close and at interpreter exit.
``markers.batch(path)`` also accepts a path (one shared writer per path).

The file is created with ``O_EXCL | O_NOFOLLOW``; an existing file is appended to only when
it is a regular file (not a symlink) owned by this user.
"""
from __future__ import annotations

import atexit
import json
import os
import stat
import threading
import time

RESERVED = frozenset(("start_ns", "end_ns", "tid", "python_tids"))


def python_tids() -> frozenset:
    """The kernel thread ids of the interpreter's threads (those ``threading`` knows: threads it
    started, the main thread, and foreign threads that asked for ``current_thread()``)."""
    return frozenset(t.native_id for t in threading.enumerate() if t.native_id is not None)


class MarkerFileError(OSError):
    """The markers path exists but is not a regular file of ours, or cannot be opened."""


def _open_append(path: str, exclusive: bool) -> int:
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        if exclusive:
            raise MarkerFileError(f"{path} already exists") from None
    try:
        fd = os.open(path, flags | os.O_NONBLOCK)  # O_NONBLOCK: never hang on a FIFO
    except OSError as exc:
        raise MarkerFileError(f"cannot open {path}: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise MarkerFileError(f"{path} exists and is not a regular file owned by this user")
    return fd


class MarkerWriter:
    """Appends one JSON line per batch to ``path``; thread-safe."""

    def __init__(self, path: str | os.PathLike, *, exclusive: bool = False, flush_s: float = 1.0):
        self.path = os.fspath(path)
        self._f = os.fdopen(_open_append(self.path, exclusive), "a", encoding="utf-8",
                            buffering=1 << 16)
        self._lock = threading.Lock()
        self._flush_s = flush_s
        self._next_flush = time.monotonic() + flush_s
        self.count = 0
        self._python_tids: frozenset = frozenset()
        atexit.register(self.close)

    def write(self, start_ns: int, end_ns: int, **extra) -> None:
        rec = {"start_ns": start_ns, "end_ns": end_ns, "tid": threading.get_native_id()}
        if extra:
            rec.update(extra)
        tids = python_tids()
        with self._lock:
            if self._f is None:
                raise ValueError("MarkerWriter is closed")
            if tids != self._python_tids:  # written when it changes: a few lines per run
                rec["python_tids"] = sorted(tids)
                self._python_tids = tids
            line = json.dumps(rec, separators=(",", ":"), default=str) + "\n"
            self._f.write(line)
            self.count += 1
            if time.monotonic() >= self._next_flush:
                self._f.flush()
                self._next_flush = time.monotonic() + self._flush_s

    def batch(self, **extra) -> "_Batch":
        return _Batch(self, extra)

    def flush(self) -> None:
        with self._lock:
            if self._f is not None:
                self._f.flush()

    def close(self) -> None:
        with self._lock:
            f, self._f = self._f, None
        if f is not None:
            f.close()
            atexit.unregister(self.close)

    def __enter__(self) -> "MarkerWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Batch:
    """Context manager for one batch; ``extra`` may be added to while inside (``b["rows"] = n``)."""

    __slots__ = ("writer", "extra", "start_ns")

    def __init__(self, writer: MarkerWriter, extra: dict):
        if RESERVED.intersection(extra):
            raise ValueError(f"marker extra keys may not be {sorted(RESERVED)}")
        self.writer, self.extra = writer, extra

    def __setitem__(self, key: str, value) -> None:
        self.extra[key] = value

    def __enter__(self) -> "_Batch":
        self.start_ns = time.monotonic_ns()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        end = time.monotonic_ns()
        if exc_type is not None:
            self.extra["error"] = exc_type.__name__
        self.writer.write(self.start_ns, end, **self.extra)


_writers: dict[str, MarkerWriter] = {}
_writers_lock = threading.Lock()


def batch(target: MarkerWriter | str | os.PathLike, **extra) -> _Batch:
    """``with batch(writer_or_path, **extra):`` records one batch around the block."""
    if not isinstance(target, MarkerWriter):
        path = os.fspath(target)
        w = _writers.get(path)
        if w is None or w._f is None:
            with _writers_lock:
                w = _writers.get(path)
                if w is None or w._f is None:
                    w = _writers[path] = MarkerWriter(path)
        target = w
    return _Batch(target, extra)


def close_all() -> None:
    """Close the writers that :func:`batch` opened for paths (flushing their lines)."""
    with _writers_lock:
        writers = list(_writers.values())
        _writers.clear()
    for w in writers:
        w.close()


def _valid_ns(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63


def read_markers(path: str | os.PathLike) -> tuple[list[dict], int]:
    """(markers, bad_line_count). A line is bad when it is not a JSON object with integer
    ``0 <= start_ns <= end_ns < 2**63``; blank lines are skipped and not counted."""
    recs, bad, _complete = read_marker_lines(path)
    return recs, bad


def read_marker_lines(path: str | os.PathLike) -> tuple[list[dict], int, bool]:
    """:func:`read_markers` and whether the last line read is finished (ends in a newline, or
    is blank): False when a writer may still be inside it."""
    out, bad, complete = [], 0, True
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            complete = line.endswith("\n") or not line.strip()
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):
                bad += 1
                continue
            if (
                isinstance(rec, dict)
                and _valid_ns(rec.get("start_ns"))
                and _valid_ns(rec.get("end_ns"))
                and rec["start_ns"] <= rec["end_ns"]
            ):
                out.append(rec)
            else:
                bad += 1
    return out, bad, complete


def read_markers_df(path: str | os.PathLike):
    """(pandas DataFrame with int64 ``start_ns``/``end_ns`` plus any extra keys, bad_line_count)."""
    recs, bad = read_markers(path)
    return markers_frame(recs), bad


def markers_frame(recs: list[dict]):
    """The markers of :func:`read_markers` as a DataFrame with int64 ``start_ns``/``end_ns``."""
    import pandas as pd

    df = pd.DataFrame.from_records(recs) if recs else pd.DataFrame({"start_ns": [], "end_ns": []})
    df["start_ns"] = df["start_ns"].astype("int64")
    df["end_ns"] = df["end_ns"].astype("int64")
    return df
