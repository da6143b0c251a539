"""The syscall source: every preadv2 / preadv / pread64 call of the target (probes/syscalls.bpf.c,
loaded by engramprof/bpf/syscalls.py) -> read events of kind ``syscall``.

The probe writes one fixed-size record per call into a ring buffer without waking user space;
each record carries the file the call read as the kernel had it at entry (device, inode,
O_DIRECT: probes/targets.h fd_file_walk), so a path is a name for that identity and never a guess
from the fd number, which another file may have had before or since.  Each drain sends the records
down the pipeline of engramprof/record: decoder -> enrichers ((device, inode) -> path, from the
process's open files and mappings as scanned, the io_uring source's
:class:`~.filepaths.FilePathEnricher`; the file's fingerprint; path + offset -> tensor / row) -> Arrow
table -> sink, and
into the running aggregates of the live view and the summary (:class:`~engramprof.record.live.LiveAccount`).
The kernel keeps exact totals and per-fd log2 histograms so the summary stays right when
records are lost; they are snapshot into ``tables/`` about once a second (kill -9 safety).

Lost records: after every drain the kernel's ``lost_records`` total is read; when it grew,
one ``lost_records`` sample row (start_ns, end_ns = the CLOCK_MONOTONIC times of the previous
and this reading, lost = the growth) says where the record stream has its hole.  The times are
when the records were dropped, i.e. when those calls returned.

The same probe reports kswapd's wake-ups and sleeps (``kswapd_events``, system-wide).  This
source is required: without it there is no recording, and its summary is the summary's top level.
"""
from __future__ import annotations

import time

import numpy as np

from engramprof import trace
from engramprof.bpf import syscalls as syscalls_probe
from engramprof.record.columns import EventTableBuilder
from engramprof.record.decode import CallDecoder, LostRecords, VmEventDecoder
from engramprof.record.enrich import PerPid, TensorEnricher
from engramprof.record.live import LiveAccount
from engramprof.record.sources.base import YES, Availability, Recording, Source, sync_probe_targets
from engramprof.record.sources.filepaths import FilePathEnricher
from engramprof.record.summary import RunFacts, summarize_run
from engramprof.sampling.native import NativeStacks, native_table
from engramprof.target.identity import FileIdentities


class SyscallsSource(Source):
    """The call probe wired to the pipeline: the recording's required source."""

    name = "syscalls"
    title = "preadv2/preadv/pread64/read/readv calls"
    required = True

    def __init__(self, rec: Recording):
        super().__init__(rec)
        self.config = syscalls_probe.SyscallsConfig(tgid=rec.pid, tid=rec.tid, min_ns=int(rec.options.min_us * 1000),
                                         syscall_hook=rec.options.syscall_hook, selection=rec.selection,
                                         # the code view's native frames, at the Python stacks' rate
                                         native_every_ns=syscalls_probe.native_every_ns(rec.options.stack_hz))
        #: the native stacks' unwinder (engramprof/sampling/native.py), with the probe's ring
        self.native = None
        self.plan: syscalls_probe.SyscallsPlan | None = None
        self.probe: syscalls_probe.SyscallsProbe | None = None
        self.calls: CallDecoder | None = None
        self.vm_events = VmEventDecoder()
        self.lost = LostRecords("lost_records")  # the call ring's (checked from its arming on)
        self.file_paths: PerPid | None = None
        self.fd_names = FdSlotNames()
        #: read events whose file (device, inode) no scan of the process's open files and mappings
        #: named: path "" (counted, never guessed from the fd number)
        self.unnamed = 0
        self.detached = False
        #: the kernel's totals, per-fd histograms and bio histogram, read once after the last drain
        self.final: tuple[dict, dict, object] | None = None

    def available(self) -> Availability:
        """The plan: which tracepoints this kernel has (raises when tracefs cannot be read or a
        required tracepoint is missing: there is no recording without this source)."""
        p = self.plan = syscalls_probe.plan(self.config)
        if p.missing:
            self.rec.notes.append(f"tracepoints missing, evidence not collected: {', '.join(p.missing)}")
        return YES

    def start_meta(self) -> dict:
        p = self.plan
        return {"probe": syscalls_probe.PROBE_FILE, "probe_version": syscalls_probe.layout.header_define("ENGRAMPROF_PROBE_VERSION"),
                "syscall_hook": self.hook_name(), "min_ns": self.config.min_ns,
                "missing_tracepoints": p.missing, "missing_evidence": p.missing_columns}

    def hook_name(self) -> str:
        return "raw_syscalls" if self.plan.raw_syscalls else "syscalls tracepoints"

    def load(self) -> None:
        """The targets' open files and mappings now (a later process's: at its first call), then
        the probe: compiled and attached at once (BCC attaches while it loads)."""
        rec, sel = self.rec, self.rec.selection
        known = {(d, i): (p, False) for d, i, p in sel.files}
        paths = rec.paths
        self.file_paths = PerPid(lambda pid: FilePathEnricher(pid, paths, known, names=rec.kernel_file_name))
        for t in sel.pids:
            self.file_paths.of(t)
        try:
            self.probe = syscalls_probe.SyscallsProbe(self.plan)
        except Exception as exc:
            if not self.config.native_every_ns:
                raise
            # the stack copy needs bpf_task_pt_regs (Linux 5.15): without it, the reads alone
            self.rec.notes.append(f"native frames not recorded: the probe with stack copies did not load "
                                  f"({str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__})")
            self.config.native_every_ns = 0
            self.probe = syscalls_probe.SyscallsProbe(self.plan)
        if self.probe.native_ring is not None:
            self.native = NativeStacks(rec.notes)
        # probe -> decoder -> enrichers -> table -> sink, plus the live aggregates
        self.calls = CallDecoder(self.probe.record_dtype, self.probe.armed_ns)
        self.identities = FileIdentities(rec.pid, rec.paths)
        self.enrichers = [self.file_paths, self.identities,
                          TensorEnricher(rec.paths, rec.tensors, headers=self.identities.header_of)]
        self.tables = EventTableBuilder(self.calls.syscall_dictionary, rec.paths, rec.tensors,
                                        missing=self.plan.missing_columns)
        self.account = LiveAccount(rec.state, rec.paths, rec.tensors)

    def arm(self) -> None:
        """Attached at load."""

    def begin_window(self, start_ns: int) -> None:
        """Calls that entered before ``start_ns`` are counted (``partial_at_start``), not kept."""
        self.calls.window.begin(start_ns)
        self.window_ns = start_ns
        self.lost.checked_ns = self.probe.armed_ns

    @property
    def partial_at_start(self) -> int:
        return self.calls.partial_at_start if self.calls else 0

    def drain(self, sink) -> None:
        """One pass down the pipeline for everything the probe has written since the last."""
        kswapd = self.vm_events.decode(self.probe.vm_ring.drain())
        if kswapd is not None:
            sink.add_samples("kswapd_events", kswapd)
        self._drain_native(sink)
        recs = self.probe.ring.drain()
        self.lost.check(sink, self.probe.lost_records())
        batch = self.calls.decode(recs)
        if batch is not None:
            for e in self.enrichers:
                e.enrich(batch)
            self.unnamed += unnamed_count(batch, self.rec.paths.code(""))
            self.fd_names.add(batch, self.rec.paths)
            self.rec.files_read(batch.recs, batch.cols["path"])  # a file read for the first time
            if self.identities.changed:  # a file seen for the first time: tables/files.parquet again
                sink.put_table("files", self.identities.table())
            self.account.add(batch)
            sink.add_events(self.tables.build(batch))
        if self.detached and self.final is None:  # the last drain: the kernel's final counts
            self.final = self._kernel_state()
            if self.rec.writer is not None:
                self._put_kernel_tables(sink, self.final[1], self.final[2])

    def _drain_native(self, sink) -> None:
        """The native stacks copied since the last drain go to the unwinder; after the last drain
        its frames are the ``native_stacks`` series."""
        if self.native is None:
            return
        for r in self.probe.native_ring.drain():
            if int(r["ts_ns"]) < getattr(self, "window_ns", 1 << 63):  # a call before the window: not an event
                continue
            self.native.add(int(r["pid"]), int(r["tid"]), int(r["ts_ns"]), int(r["ip"]), int(r["sp"]), int(r["bp"]),
                            r["data"][:int(r["len"])].tobytes())
        if self.detached and self.final is None:
            self.native.stop()
            if self.native.rows:
                sink.add_samples("native_stacks", native_table(self.native.rows))

    def _kernel_state(self) -> tuple[dict, dict, object]:
        p = self.probe
        bio = p.bio_histogram() if self.plan.features.get("HAVE_BIO") else None
        for more in self.rec.bio_histograms:  # the fault probe's bios (a mapped reader queues them in faults)
            try:
                h = more()
            except Exception:  # that probe was dropped or closed: its bios are not counted
                continue
            if h is not None:
                bio = h.copy() if bio is None else bio + h[:len(bio)]
        return p.totals(), p.histograms(self.fd_names.fds_seen), bio

    def _put_kernel_tables(self, sink, hists: dict, bio_hist) -> None:
        sink.put_table("latency_log2_by_fd", trace.fd_latency_table(hists, self.fd_names.path_of_slot))
        if bio_hist is not None:
            sink.put_table("bio_latency_log2", trace.bio_latency_table(bio_hist))

    def detach(self) -> int | None:
        """The syscall hooks first (no call completes after its evidence hooks are gone):
        returns when, the recording's end."""
        self.detached = True
        return self.probe.detach() if self.probe is not None else None

    def sync_targets(self) -> None:
        sync_probe_targets(self.probe)

    def live_targets(self) -> list[int] | None:
        return self.probe.targets.live_tgids() if self.probe is not None else None

    def seen_tgids(self) -> set[int]:
        out = set()
        targets = getattr(self.probe, "targets", None)
        if targets is not None and targets.tgids is not None:
            out.update(targets.live_tgids())
        if self.file_paths is not None:
            out.update(list(self.file_paths.by_pid))
        return out

    def totals(self) -> dict[str, int]:
        return self.probe.totals()

    def native_summary(self) -> dict | None:
        if self.native is None:
            return None
        return {**self.probe.native_totals(), **self.native.summary()}

    def snapshot(self, sink) -> dict:
        """The kernel's histograms (tables/) and totals so far (meta.json)."""
        try:
            totals, hists, bio = self._kernel_state()
        except Exception as exc:  # context; never stop the recording for it
            self.rec.notes.append(f"histogram snapshot failed: {exc}")
            return {}
        self._put_kernel_tables(sink, hists, bio)
        return {"totals": totals, "totals_ns": time.monotonic_ns(), "lost_records": totals.get("lost_records", 0),
                "lost_record_intervals": self.lost.intervals}

    def summary(self) -> dict:
        """The summary's top level: the calls, their latency and evidence, the run's facts."""
        rec = self.rec
        totals, hists, bio = self.final or ({}, {}, None)
        run = RunFacts(pid=rec.pid, tid=rec.tid, end_reason=rec.end_reason, partial_at_start=self.partial_at_start,
                       kswapd_events=self.vm_events.events,
                       missing_evidence=self.plan.missing_columns if self.probe else [],
                       syscall_hook=self.hook_name(), output=rec.output, notes=rec.notes)
        out = summarize_run(run, rec.state, totals, hists, rec.end_ns, bio)
        out["unnamed_file_reads"] = self.unnamed
        out["native_stacks"] = self.native_summary()
        return out

    def closing_meta(self, summary: dict | None) -> dict:
        totals = (self.final or ({}, {}, None))[0]
        return {"totals": totals, "lost_records": totals.get("lost_records", 0),
                "lost_record_intervals": self.lost.intervals, "partial_at_start": self.partial_at_start,
                "unnamed_file_reads": self.unnamed}

    def close(self) -> None:
        if self.probe is not None:
            self.probe.close()


def unnamed_count(batch, empty_code: int) -> int:
    """Read events of the batch whose file the kernel named (inode known) but no scan did."""
    return int(((batch.cols["path"] == empty_code) & (batch.recs["ino"] != 0)).sum())


class FdSlotNames:
    """A name for each of the kernel's per-fd latency histogram slots (keyed by fd number, over
    every traced process): the path of the last read event on that fd, first process first.
    Only the histogram table's label; read events are named by their (device, inode)."""

    def __init__(self):
        self.last: dict[int, str] = {}
        self.fds_seen: set[int] = set()

    def add(self, batch, paths) -> None:
        fds = batch.recs["fd"]
        if not len(fds):
            return
        codes = batch.cols["path"]
        uniq, last = np.unique(fds[::-1], return_index=True)
        for fd, i in zip(uniq.tolist(), last.tolist()):
            self.fds_seen.add(fd)
            name = paths.values[codes[len(fds) - 1 - i]]
            if name:
                self.last[fd] = name

    def path_of_slot(self, fdslot: int) -> str:
        return self.last.get(fdslot, "")
