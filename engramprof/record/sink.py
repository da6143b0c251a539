"""The end of the line: tables handed to the :class:`~engramprof.trace.TraceWriter`.

Read-event tables gather until a flush (about once a second, or 500k rows) and go out as one
Parquet part, written by a background thread so a slow disk never delays a drain.  Sample rows
the probe produces (kswapd events) go out at the same flush.  A write that fails (disk full) is
noted, and tracing goes on.
"""
from __future__ import annotations

import queue
import threading

import pyarrow as pa

FLUSH_ROWS = 500_000


class TraceSink:
    def __init__(self, writer, notes: list[str]):
        self.writer = writer
        self.notes = notes
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._samples: dict[str, list[pa.Table]] = {}
        self._q: queue.Queue = queue.Queue(maxsize=8)
        self._thread: threading.Thread | None = None

    def add_events(self, table: pa.Table) -> None:
        self._pending.append(table)
        self._pending_rows += table.num_rows
        if self._pending_rows >= FLUSH_ROWS:
            self.flush()

    def add_samples(self, name: str, table: pa.Table) -> None:
        self._samples.setdefault(name, []).append(table)

    def flush(self) -> None:
        """Hand the pending tables over (one Parquet part per series)."""
        samples, self._samples = self._samples, {}
        if self.writer:
            for name, tables in samples.items():
                self.writer.append_samples(name, pa.concat_tables(tables) if len(tables) > 1 else tables[0])
        if not self._pending:
            return
        pending, self._pending, self._pending_rows = self._pending, [], 0
        table = pa.concat_tables(pending, promote_options="permissive") if len(pending) > 1 else pending[0]
        if self.writer:
            self._start_thread()
            self._q.put(table)

    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._write_loop, name="engramprof-writer", daemon=True)
            self._thread.start()

    def _write_loop(self) -> None:
        while True:
            table = self._q.get()
            if table is None:
                return
            try:
                self.writer.append_calls(table)
            except Exception as exc:  # disk full, ...: keep tracing, say so at the end
                self.notes.append(f"writing calls failed: {exc}")

    def close(self) -> None:
        """Wait until every handed-over table is written."""
        if self._thread is not None:
            self._q.put(None)
            self._thread.join()
            self._thread = None
