"""The off-CPU spans of the target's threads: probe records -> ``offcpu`` sample rows.

:class:`OffcpuDecoder` turns a drained batch of ``struct offcpu_record`` (probes/sched.bpf.c,
a numpy structured array) into one Arrow table of the ``offcpu`` sample schema
(engramprof/trace/schema.py) with a handful of numpy casts: no Python work per span.
:class:`SchedSource` is the recorder's side of the probe: load it, drain it into the sink
(``samples/offcpu/part-*.parquet``, flushed with everything else about once a second), count
what the kernel could not deliver and say where (``offcpu_lost`` rows, the same columns as
``lost_records``), and report its totals for meta.json and the summary.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from engramprof import trace
from engramprof.bpf import sched
from engramprof.record.decode import DrainBatching, LostRecords, ProbeTotals, WindowStart, drain_into
from engramprof.record.sources.base import NOT_ASKED, YES, Availability, Recording, Source, sync_probe_targets

SAMPLE = "offcpu"
LOST_SAMPLE = "offcpu_lost"  # holes in the span stream: start_ns, end_ns, lost (lost_records' schema)


class OffcpuDecoder:
    """``struct offcpu_record`` -> ``offcpu`` sample rows (columnar, one table per drain)."""

    def __init__(self):
        self.schema = trace.sample_schema(SAMPLE)
        self.spans = 0

    def decode(self, recs: np.ndarray) -> pa.Table | None:
        if len(recs) == 0:
            return None
        self.spans += len(recs)
        return pa.Table.from_arrays([
            pa.array(recs["tid"].astype(np.int32)),
            pa.array(recs["start_ns"].astype(np.int64)),
            pa.array(recs["end_ns"].astype(np.int64)),
            pa.array(recs["preempted"] != 0),
            pa.array(recs["waker_tid"].astype(np.int32)),
            pa.array(recs["waker_pid"].astype(np.int32)),
        ], schema=self.schema)


class SchedSource(ProbeTotals, Source):
    """The sched probe: the off-CPU spans of the target's threads, fed to the sink."""

    name = "offcpu"
    title = "off-CPU spans"
    absent = "not recorded"
    absent_meta = {"offcpu": None}

    def __init__(self, rec: Recording):
        super().__init__(rec)
        self.config = sched.SchedConfig(tgid=rec.pid, tid=rec.tid)
        self.config.selection = rec.selection  # several pids, children, cgroups: probes/targets.h
        self.plan: sched.SchedPlan | None = None
        self.probe: sched.LoadedSchedProbe | None = None
        self.decoder = OffcpuDecoder()
        #: the recording window's start: spans that began before it are dropped and counted
        self.window = WindowStart(field="start_ns")
        self.batching = DrainBatching()  # spans: like faults, drained a few thousand at a time
        self.lost = LostRecords(LOST_SAMPLE)
        self.end_ns: int | None = None
        self._totals: dict[str, int] = {}

    def available(self) -> Availability:
        if not self.rec.options.offcpu:
            return NOT_ASKED
        if not self.rec.selection.selects_processes:
            # --file alone: every thread of the machine would be followed off-CPU
            return Availability(False, "--file alone selects no process")
        return YES

    def load(self) -> None:
        """Compile the sched probe, attached by :meth:`arm`."""
        self.plan = sched.plan(self.config)
        self.probe = sched.LoadedSchedProbe(self.plan, arm=False)
        self.rec.put_meta(offcpu=self.summary())

    def arm(self) -> None:
        """Attach the probe: no span starts before this instant."""
        self.lost.checked_ns = self.probe.arm()
        self.window.begin(self.lost.checked_ns)

    def begin_window(self, start_ns: int) -> None:
        """Spans that began before the recording's window (``start_ns``) are not kept."""
        self.window.begin(start_ns)

    def meta(self) -> dict:
        p = self.plan
        return {"probe": sched.PROBE_FILE, "waker_hook": p.waker_hook if p else None,
                "missing_tracepoints": p.missing if p else []}

    def drain(self, sink) -> None:
        if self.probe is None:
            return
        recs = self.probe.ring.drain() if self.batching.due(self.probe.ring) else None
        drain_into(sink, self.probe, recs, ((SAMPLE, self.decoder.decode),), self.lost, window=self.window)

    def detach(self) -> None:
        if self.probe is not None and self.end_ns is None:
            self.end_ns = self.probe.detach()
            self.batching.final = True

    def sync_targets(self) -> None:
        sync_probe_targets(self.probe)

    def snapshot(self, sink) -> dict:
        return {"offcpu": self.summary()}

    def summary(self) -> dict:
        """What meta.json and the summary say about the spans (``offcpu``)."""
        t = self.totals()
        return {**self.meta(), "spans": t.get("spans", 0), "recorded": self.decoder.spans,
                "partial_at_start": self.window.partial_at_start,
                "lost_records": t.get("lost_records", 0), "lost_record_intervals": self.lost.intervals,
                "preempted": t.get("preempted", 0), "woken": t.get("woken", 0),
                "untracked": t.get("no_state", 0), "offcpu_s": round(t.get("sum_ns", 0) / 1e9, 6)}

    def close(self) -> None:
        if self.probe is not None:
            self.totals()
            self.probe.close()
            self.probe = None
