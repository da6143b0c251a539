"""The end of the line: tables handed to the :class:`~engramprof.trace.TraceWriter`.

Read-event tables gather until a flush (about once a second, or 500k rows) and go out as one
Parquet part, written by a background thread so a slow disk never delays a drain.  Sample rows
the recorder produces (kswapd events, lost-record intervals), one-off tables (the kernel's
histograms, the traced files' identities) and metadata snapshots go out through the same
thread, in order, at the same flush: a ``kill -9`` loses at most the last second of each.

A write that fails (disk full, over quota, I/O error: :class:`~engramprof.trace.writer.WriteFailed`)
sets :attr:`TraceSink.failed`; everything after it is dropped (the recorder sees ``failed``,
stops and closes the bundle with the reason).
"""
from __future__ import annotations

import queue
import threading

import pyarrow as pa

from engramprof.trace.writer import WriteFailed

FLUSH_ROWS = 500_000


class TraceSink:
    def __init__(self, writer, notes: list[str]):
        self.writer = writer
        self.notes = notes
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._samples: dict[str, list[pa.Table]] = {}
        self._jobs: list[tuple] = []  # tables and meta snapshots for the next flush
        self._q: queue.Queue = queue.Queue(maxsize=8)
        self._thread: threading.Thread | None = None
        #: None, or the first WriteFailed: nothing more is written
        self.failed: WriteFailed | None = None
        self.dropped_rows = 0  # read events not written because a write had failed

    def add_events(self, table: pa.Table) -> None:
        self._pending.append(table)
        self._pending_rows += table.num_rows
        if self._pending_rows >= FLUSH_ROWS:
            self.flush()

    def add_samples(self, name: str, table: pa.Table) -> None:
        self._samples.setdefault(name, []).append(table)

    def put_table(self, name: str, table: pa.Table) -> None:
        """tables/NAME.parquet (replacing an earlier version) at the next flush."""
        self._jobs = [j for j in self._jobs if not (j[0] == "table" and j[1] == name)]
        self._jobs.append(("table", name, table))

    def put_meta(self, **kw) -> None:
        """Update and rewrite meta.json at the next flush (after the parts of that flush)."""
        self._jobs.append(("meta", kw))

    def flush(self) -> None:
        """Hand the pending tables over (one Parquet part per series, then the tables and meta)."""
        jobs: list[tuple] = []
        samples, self._samples = self._samples, {}
        for name, tables in samples.items():
            jobs.append(("samples", name, pa.concat_tables(tables) if len(tables) > 1 else tables[0]))
        if self._pending:
            pending, self._pending, self._pending_rows = self._pending, [], 0
            table = pa.concat_tables(pending, promote_options="permissive") if len(pending) > 1 else pending[0]
            jobs.insert(0, ("calls", table))
        jobs += self._jobs
        self._jobs = []
        if not jobs or not self.writer:
            return
        if self.failed is not None:
            self.dropped_rows += sum(j[1].num_rows for j in jobs if j[0] == "calls")
            return
        self._start_thread()
        for job in jobs:
            self._q.put(job)

    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._write_loop, name="engramprof-writer", daemon=True)
            self._thread.start()

    def _write_loop(self) -> None:
        w = self.writer
        while True:
            job = self._q.get()
            if job is None:
                return
            if self.failed is not None:
                if job[0] == "calls":
                    self.dropped_rows += job[1].num_rows
                continue
            try:
                if job[0] == "calls":
                    w.append_calls(job[1])
                elif job[0] == "samples":
                    w.append_samples(job[1], job[2])
                elif job[0] == "table":
                    w.write_table(job[1], job[2])
                elif job[0] == "meta":
                    w.update_meta(**job[1])
                    w.flush_meta()
                    if w.failed is not None:
                        raise WriteFailed(0, w.failed[1])
            except WriteFailed as exc:  # disk full, ...: stop writing; the recorder stops too
                self.failed = exc
                if job[0] == "calls":
                    self.dropped_rows += job[1].num_rows
            except Exception as exc:  # a bad table must not end the recording
                self.notes.append(f"writing {job[0]} failed: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        """Wait until every handed-over table is written."""
        if self._thread is not None:
            self._q.put(None)
            self._thread.join()
            self._thread = None
