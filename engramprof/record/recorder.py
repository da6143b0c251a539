"""Per-call preadv2 / preadv / pread64 recording for one process (``engramprof syscalls``).

The probe (probes/preadv.bpf.c) writes one fixed-size record per call into a ring buffer
without waking user space; every ``DRAIN_S`` the recorder drains it in bulk and sends the
records down the pipeline of engramprof/record: decoder -> enrichers (fd -> path; path +
offset -> tensor / row) -> Arrow table -> trace writer, one Parquet part per second, so memory
stays flat however long it runs.  Running aggregates feed the live view and the final summary;
the kernel keeps exact totals and per-fd log2 histograms so the summary stays right when
records are lost.

It ends on: the duration, SIGINT/SIGTERM (the caller sets ``stop``), the target's exit
(pidfd becomes readable), or a write that fails (disk full: ``end_reason`` ``disk-full``,
``disk-quota``, ``disk-io-error``).  In every case the trace is closed cleanly: the parts
written before stay loadable and meta.json gets the kernel's totals.

Crash safety (``kill -9`` at any moment): parts appear atomically (engramprof/trace/writer.py),
and everything is flushed about once a second -- calls, samples, lost-record intervals, the
kernel's histograms (a snapshot), the traced files' identities, and the running totals in
meta.json -- so a killed recorder loses at most the last second.

Lost records: after every drain the kernel's ``lost_records`` total is read; when it grew,
one ``lost_records`` sample row (start_ns, end_ns = the CLOCK_MONOTONIC times of the previous
and this reading, lost = the growth) says where the record stream has its hole.  The times are
when the records were dropped, i.e. when those calls returned.
"""
from __future__ import annotations

import threading
import time

import pyarrow as pa

from engramprof import trace
from engramprof.bpf import evictions as eviction_probe
from engramprof.bpf import faults as fault_probe
from engramprof.bpf import loader
from engramprof.bpf import pagecache as pagecache_probe
from engramprof.bpf import targets as target_maps
from engramprof.host.fdmap import FdResolver
from engramprof.record.columns import EventTableBuilder
from engramprof.record.decode import CallDecoder, LostRecords, VmEventDecoder
from engramprof.record.enrich import FdPaths, TensorEnricher
from engramprof.record.evictions import EvictionRecorder
from engramprof.record.faults import FaultRecorder
from engramprof.record.live import FileStat, LatencyHist, LiveAccount, LiveState  # noqa: F401 (re-exported)
from engramprof.record.offcpu import OffcpuRecorder
from engramprof.record.pagecache import PagecacheRecorder
from engramprof.record.sink import TraceSink
from engramprof.record.strings import Interner
from engramprof.record.summary import RunFacts, summarize_run
from engramprof.sampling.sampler import Sampler
from engramprof.target.identity import FileIdentities
from engramprof.target.process import (
    ExitWatch,
    check_privileges,
    check_target,
    cmdline,
    pid_state,
)
from engramprof.target.selection import Selection

DRAIN_S = 0.05
FLUSH_S = 1.0
HIST_FLUSH_S = 1.0  # snapshot of the kernel's histograms into tables/ (replaced each time)
#: record the target's off-CPU spans (probes/sched.bpf.c) unless told not to (--no-offcpu)
OFFCPU_DEFAULT = True


class SyscallTracer:
    """Wires the probe to the pipeline and runs it: :meth:`start`, :meth:`run`, :meth:`finish`."""

    def __init__(self, pid: "int | Selection", tid: int = 0, min_us: float = 0.0, output: str | None = None,
                 sample_hz: float = 10.0, syscall_hook: str = "auto", argv: list[str] | None = None,
                 offcpu: bool | None = None, faults: bool = True, fault_address: bool = True,
                 evictions: bool = True):
        # what to trace: one pid, or a Selection (--pid repeated, --children, --cgroup, --file)
        self.selection = Selection.of(pid)
        if isinstance(pid, Selection):
            tid = pid.tid
        self.pid, self.tid = self.selection.first_pid, tid
        self.selection.tid = tid
        # page faults (probes/faults.bpf.c): attached when the kernel has the filemap fault
        # tracepoint; fault_address=False forces the path without exceptions:page_fault_user
        self.faults_wanted, self.fault_address = faults, fault_address
        # evictions of the target's files' pages (probes/evictions.bpf.c), when the kernel has
        # filemap:mm_filemap_delete_from_page_cache (engramprof/record/evictions.py)
        self.evictions_wanted, self.evictions = evictions, None
        self.faults = None
        #: page-cache insertions, readahead and hints of the target's files (probes/pagecache.bpf.c)
        self.pagecache = None
        self.output = output
        self.sample_hz = sample_hz
        self.config = loader.ProbeConfig(tgid=self.pid, tid=tid, min_ns=int(min_us * 1000), syscall_hook=syscall_hook,
                                         selection=self.selection)
        self.argv = argv or []
        self.stop = threading.Event()
        self.end_reason = "running"
        self.state = LiveState()
        self.writer: trace.TraceWriter | None = None
        self.probe: loader.LoadedProbe | None = None
        self.sampler = None
        self.notes: list[str] = []
        if self.selection.files and (matched := self.selection.matched_note()):
            self.notes.append(matched)  # e.g. an overlayfs file: its real file's inode too
        self.paths = Interner("")
        self.tensors = Interner("")
        self._exit: list[ExitWatch] = []
        self._targets_checked = 0.0
        #: the off-CPU spans of the target's threads (samples/offcpu), None with --no-offcpu
        self.offcpu = OffcpuRecorder(pid, tid) if (OFFCPU_DEFAULT if offcpu is None else offcpu) else None
        if self.offcpu is not None:
            if not self.selection.selects_processes:
                # --file alone: every thread of the machine would be followed off-CPU
                self.offcpu = None
                self.notes.append("off-CPU spans not recorded: --file alone selects no process")
            else:
                self.offcpu.config.selection = self.selection
        self.calls: CallDecoder | None = None
        self.vm_events = VmEventDecoder()
        self.sink = TraceSink(None, self.notes)
        self.lost = LostRecords("lost_records")  # the call ring's (checked from its arming on)
        #: test hook: while set, run() does not drain (the ring fills up and records are lost)
        self.pause_draining = threading.Event()

    @property
    def partial_at_start(self) -> int:
        return self.calls.partial_at_start if self.calls else 0

    @property
    def kswapd_events(self) -> int:
        return self.vm_events.events

    # ---- life cycle -------------------------------------------------------------------
    def start(self) -> None:
        # Arrow's default (mimalloc) pool keeps freed batches mapped: over a long trace the
        # collector's RSS creeps up; the system allocator returns them (measured flat, see README)
        pa.set_memory_pool(pa.system_memory_pool())
        for t in self.selection.pids:
            check_target(t, self.tid)
        check_privileges()
        p = self.plan = loader.plan(self.config)
        if p.missing:
            self.notes.append(f"tracepoints missing, evidence not collected: {', '.join(p.missing)}")
        self._exit = [ExitWatch(t) for t in self.selection.pids]
        self.fd_paths = FdPaths(self.paths)
        for t in self.selection.pids:  # their fd tables now (a later process's: at its first call)
            self.fd_paths.of(t)
        self.fd_paths.started = True
        if self.output:
            self.writer = trace.TraceWriter(self.output, meta=self._meta())
            self.sink.writer = self.writer
        # evictions first: the target's files are watched before its first recorded read
        self._start_evictions()
        self._start_pagecache()  # before the call probe too: its compile must not fill the call ring
        try:
            self.probe = loader.LoadedProbe(p)
        except BaseException:
            if self.evictions is not None:
                self.evictions.close()
            if self.pagecache is not None:
                self.pagecache.close()
            if self.writer:  # leave a closed, loadable (empty) bundle that says why
                self.writer.close(end_reason="probe load failed", end_ns=time.monotonic_ns())
            raise
        if self.evictions is not None:  # while the other probes compile: keep the ring from filling
            self.evictions.drain(self.sink)
        self._start_faults()
        self._start_offcpu()
        self._build_pipeline()
        self._arm_deferred()
        self.state.started_ns = time.monotonic_ns()
        self._begin_window(self.state.started_ns)
        self.lost.checked_ns = self.probe.armed_ns
        if self.writer:
            self.writer.update_meta(start_ns=self.state.started_ns)
            self.writer.flush_meta()
        self._start_sampler()

    def _start_faults(self) -> None:
        """The fault probe (engramprof/record/faults.py): when the kernel cannot trace faults,
        record syscalls only and say so."""
        if not self.faults_wanted:
            return
        if not fault_probe.required_available():
            self.notes.append("page faults not traced: the kernel lacks filemap:mm_filemap_fault")
            return

        use_pfu = self.fault_address
        if use_pfu and self.selection.files and not self.selection.selects_processes:
            # --file alone: page_fault_user would open per-thread state for every faulting thread
            # of the machine; the generic path opens it only at a fault on a selected file
            use_pfu = False
            self.notes.append("page faults timed from their first filemap event (--file alone: "
                              "exceptions:page_fault_user not hooked)")
        try:
            self.faults = FaultRecorder(self.pid, self.tid, self.paths, self.tensors, use_pfu=use_pfu,
                                        selection=self.selection, arm=False)  # armed by _arm_deferred
        except Exception as exc:
            self.notes.append(f"page faults not traced: {exc}")
            return
        if self.faults.plan.missing:
            self.notes.append(f"fault evidence not collected: {', '.join(self.faults.plan.missing)}")
        if self.writer:
            self.writer.update_meta(fault_probe="faults.bpf.c", fault_address=self.faults.plan.has_address,
                                    fault_missing_evidence=self.faults.plan.missing_columns)

    def _start_pagecache(self) -> None:
        """The page-cache probe (engramprof/record/pagecache.py) is evidence for readahead and
        prefetch hints: if it cannot load, record without it and say so."""
        if not pagecache_probe.required_available():
            self.notes.append("page-cache insertions not traced: the kernel lacks filemap:mm_filemap_add_to_page_cache")
            return
        try:
            self.pagecache = PagecacheRecorder(self.pid, self.tid, selection=self.selection)
            self.pagecache.start()
        except Exception as exc:
            if self.pagecache is not None:
                self.pagecache.close()
            self.pagecache = None
            self.notes.append(f"page-cache insertions not traced: {exc}")
            return
        if self.pagecache.plan.missing:
            self.notes.append(f"page-cache evidence not collected: {', '.join(self.pagecache.plan.missing)}")
        if self.writer:
            self.writer.update_meta(pagecache_probe=pagecache_probe.PROBE_FILE)

    def _arm_deferred(self) -> None:
        """Attach the fault and off-CPU probes, compiled one after the other (seconds each on a
        busy machine), together now: the recording's window begins once every probe is armed."""
        if self.faults is not None:
            try:
                self.faults.arm()
            except Exception as exc:
                self.faults.close()
                self.faults = None
                self.notes.append(f"page faults not traced: {exc}")
        if self.offcpu is not None:
            try:
                self.offcpu.arm()
            except Exception as exc:
                self.offcpu.close()
                self.offcpu = None
                self.notes.append(f"off-CPU spans not recorded: {exc}")

    def _begin_window(self, start_ns: int) -> None:
        """Every record kind keeps what began at or after ``start_ns`` (the window's start, when
        every probe is armed); what began before is counted (``partial_at_start``), not kept."""
        self.calls.window.begin(start_ns)
        if self.faults is not None:
            self.faults.begin(start_ns)
        if self.offcpu is not None:
            self.offcpu.begin(start_ns)

    def _start_offcpu(self) -> None:
        """The sched probe is context: if it cannot load, record without it and say so."""
        if self.offcpu is None:
            return
        try:
            self.offcpu.start(arm=False)  # armed by _arm_deferred
        except Exception as exc:
            self.offcpu.close()
            self.offcpu = None
            self.notes.append(f"off-CPU spans not recorded: {exc}")
        if self.writer:
            self.writer.update_meta(offcpu=self.offcpu.summary() if self.offcpu else None)

    def _start_evictions(self) -> None:
        """The eviction probe is evidence for the miss causes: without it, say so (the analysis
        keeps the proportional refault estimate)."""
        if not self.evictions_wanted:
            return
        if not eviction_probe.required_available():
            self.notes.append("evictions not traced: the kernel lacks filemap:mm_filemap_delete_from_page_cache")
            return

        try:
            self.evictions = EvictionRecorder(self.selection, list(self.selection.pids), self.paths)
        except Exception as exc:
            self.notes.append(f"evictions not traced: {exc}")
            return
        if self.evictions.plan.missing:
            self.notes.append(f"eviction contexts not seen (recorded as unknown): {', '.join(self.evictions.plan.missing)}")
        if self.writer:
            self.writer.update_meta(evictions=self.evictions.summary())

    def _meta(self) -> dict:
        p = self.plan
        return {
            # pid: the first selected process (older readers); pids and selection: everything
            "pid": self.pid or None, "tid": self.tid or None, "target_cmdline": cmdline(self.pid) if self.pid else "",
            **self.selection.meta(),
            "processes": [{"pid": p, "cmdline": cmdline(p)} for p in self.selection.pids],
            "engramprof_argv": self.argv, "probe": loader.PROBE_FILE,
            "probe_version": loader.layout.header_define("ENGRAMPROF_PROBE_VERSION"),
            "syscall_hook": self._hook_name(), "min_ns": self.config.min_ns,
            "missing_tracepoints": p.missing, "missing_evidence": p.missing_columns,
        }

    def _hook_name(self) -> str:
        return "raw_syscalls" if self.plan.raw_syscalls else "syscalls tracepoints"

    def _build_pipeline(self) -> None:
        """probe -> decoder -> enrichers -> table -> sink, plus the live aggregates."""
        self.calls = CallDecoder(self.probe.record_dtype, self.probe.armed_ns)
        self.identities = FileIdentities(self.pid, self.paths)
        self.enrichers = [self.fd_paths, self.identities,
                          TensorEnricher(self.paths, self.tensors, headers=self.identities.header_of)]
        self.tables = EventTableBuilder(self.calls.syscall_dictionary, self.paths, self.tensors,
                                        missing=self.plan.missing_columns)
        self.account = LiveAccount(self.state, self.paths, self.tensors)

    def _start_sampler(self) -> None:
        if not self.sample_hz:
            return
        try:
            pass
        except ImportError:
            return
        s = self.selection
        several = len(s.pids) != 1 or s.children or s.cgroups_v2 or s.cgroups_v1 or s.files
        try:
            self.sampler = Sampler(pid=self.pid or None, hz=self.sample_hz,
                                   follow=self.traced_tgids if several else None)
            self.sampler.start(self.writer)
        except Exception as exc:  # samplers are context; never lose the trace over them
            self.sampler = None
            self.notes.append(f"samplers not running: {exc}")

    def traced_tgids(self) -> set[int]:
        """The processes traced now, for the per-thread samplers (their thread): the --pid ones,
        what the kernel's map holds (--children's forks, a v1 cgroup's members), a v2 cgroup's
        members, and every process a read event came from (--file's readers)."""
        s = self.selection
        out = set(s.pids)
        for probe in (self.probe, self.faults.probe if self.faults else None):
            targets = getattr(probe, "targets", None)
            if targets is not None and targets.tgids is not None:
                out.update(targets.live_tgids())
                break
        if s.cgroups_v2:
            out |= s.v2_members()
        out.update(list(self.fd_paths.by_pid))
        if self.faults is not None:
            out.update(list(self.faults.mappings.by_pid))
        return out

    def target_exited(self) -> bool:
        """Every target has exited (--pid, --children; a cgroup or files select whoever comes)."""
        if not self.selection.ends_with_targets or not self._exit:
            return False
        if not all(w.exited() for w in self._exit):
            return False
        if not self.selection.children:
            return True
        now = time.monotonic()  # descendants: the kernel's map (fork adds, group death removes)
        if now - self._targets_checked < 0.25:
            return False
        self._targets_checked = now
        return not any(pid_state(t) not in (None, "Z", "X") for t in self.probe.targets.live_tgids())

    def sync_targets(self) -> None:
        """New sub-groups of a v2 cgroup, the processes of a v1 cgroup, an overlay --file's copy-up:
        into every probe's maps."""
        s = self.selection
        if not target_maps.needs_sync(s):
            return
        for probe in (self.probe, self.faults.probe if self.faults else None,
                      self.offcpu.probe if self.offcpu else None,
                      self.evictions.probe if self.evictions else None, self.pagecache.probe if self.pagecache else None):
            if probe is not None and getattr(probe, "bpf", None) is not None:
                try:
                    probe.targets.sync()
                except Exception as exc:  # context: keep recording
                    self.notes.append(f"target refresh failed: {exc}")

    def run(self, duration: float | None = None, on_tick=None) -> None:
        """Drain until duration / stop / target exit; call on_tick(self) about once a second."""
        t0 = time.monotonic()
        last_flush = last_hist = t0
        while True:
            if self.stop.wait(DRAIN_S):
                self.end_reason = self.end_reason if self.end_reason != "running" else trace.END_SIGNAL
                break
            if self.write_failed():
                self.end_reason = self.writer.failed[0] if self.writer.failed else "write-error"
                break
            if not self.pause_draining.is_set():
                self.drain()
            now = time.monotonic()
            if now - last_flush >= FLUSH_S:
                if now - last_hist >= HIST_FLUSH_S:
                    self.snapshot_kernel_state()
                    last_hist = now
                self.flush()
                self.sync_targets()
                if on_tick:
                    on_tick(self)
                self.state.reset_window()
                last_flush = now
            if duration is not None and now - t0 >= duration:
                self.end_reason = trace.END_DURATION
                break
            if self.target_exited():
                self.end_reason = trace.END_TARGET_EXIT
                break

    def write_failed(self) -> bool:
        return self.writer is not None and (self.sink.failed is not None or self.writer.failed is not None)

    def finish(self) -> dict:
        """Detach, drain what is left, write the closing metadata; return the summary."""
        probe = self.probe
        totals, hists, bio_hist = {}, {}, None
        end_ns = time.monotonic_ns()
        if probe is not None:
            end_ns = probe.detach() or end_ns
            if self.faults is not None:
                self.faults.detach()
            if self.offcpu is not None:
                self.offcpu.detach()
            if self.evictions is not None:
                self.evictions.detach()
            if self.pagecache is not None:
                self.pagecache.detach()
            self.drain()
            if self.pagecache is not None:  # and the insertion runs still open in the kernel
                self.pagecache.drain(self.sink, final=True)
            totals = probe.totals()
            hists = probe.histograms(self.fd_paths.fds_seen)
            bio_hist = probe.bio_histogram() if self.plan.features.get("HAVE_BIO") else None
        if self.sampler is not None:
            try:
                self.sampler.stop()
            except Exception as exc:
                self.notes.append(f"sampler stop failed: {exc}")
        if self.writer and probe is not None:
            self._put_kernel_tables(hists, bio_hist)
        self.flush()
        self.sink.close()
        if self.write_failed():
            if self.end_reason in ("running", *trace.END_REASONS) or not self.end_reason:
                self.end_reason = self.writer.failed[0] if self.writer.failed else "write-error"
            self.write_error = self.writer.failed[1] if self.writer.failed else str(self.sink.failed)
            self.notes.append(f"recording stopped: {self.write_error}; the kernel's totals count every call, "
                              f"{self.sink.dropped_rows:,} recorded calls could not be written")
        summary = self.summary(totals, hists, end_ns, bio_hist)
        if self.writer and self.faults is not None:
            self.writer.update_meta(faults=summary.get("faults"))
        if self.writer and self.pagecache is not None:
            self.writer.update_meta(pagecache=summary.get("pagecache"))
        if self.writer and self.evictions is not None:
            self.writer.update_meta(evictions=summary.get("evictions"))
        if self.writer:
            try:
                self.writer.close(end_ns=end_ns, end_reason=self.end_reason, totals=totals,
                                  lost_records=totals.get("lost_records", 0), notes=self.notes,
                                  lost_record_intervals=self.lost.intervals,
                                  calls_not_written=self.sink.dropped_rows,
                                  partial_at_start=self.partial_at_start,
                                  **self._fd_history(),
                                  offcpu=self.offcpu.summary() if self.offcpu else None)
            except OSError as exc:  # not even meta.json fits: the parts written stay loadable
                self.meta_error = f"{type(exc).__name__}: {exc}"
        if probe is not None:
            probe.close()
        if self.faults is not None:
            self.faults.close()
        if self.offcpu is not None:
            self.offcpu.close()
        if self.evictions is not None:
            self.evictions.close()
        if self.pagecache is not None:
            self.pagecache.close()
        for w in self._exit:
            w.close()
        return summary

    def _fd_history(self) -> dict:
        h = self.fd_paths.history() if getattr(self, "fd_paths", None) is not None else {}
        first = h.get(self.pid, {})
        out = {"fd_history": {str(k): v for k, v in first.items()}}
        if len(h) > 1:
            out["fd_history_by_pid"] = {str(p): {str(k): v for k, v in fh.items()} for p, fh in h.items()}
        return out

    write_error: str | None = None
    meta_error: str | None = None

    def _put_kernel_tables(self, hists: dict, bio_hist) -> None:
        self.sink.put_table("latency_log2_by_fd", trace.fd_latency_table(hists, self.fd_paths.path_of_slot))
        if bio_hist is not None:
            self.sink.put_table("bio_latency_log2", trace.bio_latency_table(bio_hist))

    def snapshot_kernel_state(self) -> None:
        """The kernel's histograms and totals so far, to tables/ and meta.json (kill -9 safety)."""
        if self.writer is None or self.probe is None or self.sink.failed is not None:
            return
        try:
            hists = self.probe.histograms(self.fd_paths.fds_seen)
            bio = self.probe.bio_histogram() if self.plan.features.get("HAVE_BIO") else None
            totals = self.probe.totals()
        except Exception as exc:  # context; never stop the recording for it
            self.notes.append(f"histogram snapshot failed: {exc}")
            return
        self._put_kernel_tables(hists, bio)
        if self.offcpu is not None:
            self.sink.put_meta(offcpu=self.offcpu.summary())
        if self.evictions is not None:
            self.sink.put_meta(evictions=self.evictions.summary())
        self.sink.put_meta(totals=totals, totals_ns=time.monotonic_ns(), lost_records=totals.get("lost_records", 0),
                           lost_record_intervals=self.lost.intervals, notes=list(self.notes))

    # ---- data path --------------------------------------------------------------------
    def drain(self) -> None:
        """One pass down the pipeline for everything the probe has written since the last."""
        if self.offcpu is not None:
            self.offcpu.drain(self.sink)
        if self.pagecache is not None:
            self.pagecache.drain(self.sink)
        if self.faults is not None:
            fault_events = self.faults.drain()
            if fault_events is not None:
                self.sink.add_events(fault_events)
                if self.evictions is not None:  # a newly mapped file: watch its evictions
                    self.evictions.watch_mappings(self.faults.mappings)
        kswapd = self.vm_events.decode(self.probe.vm_ring.drain())
        if kswapd is not None:
            self.sink.add_samples("kswapd_events", kswapd)
        recs = self.probe.ring.drain()
        self.lost.check(self.sink, self.probe.lost_records())
        if self.evictions is not None:
            self.evictions.drain(self.sink)
        batch = self.calls.decode(recs)
        if batch is None:
            return
        for e in self.enrichers:
            e.enrich(batch)
        if self.evictions is not None:  # a file read for the first time: watch its evictions
            self.evictions.watch_calls(batch.recs, batch.cols["path"])
        if self.identities.changed:  # a file seen for the first time: tables/files.parquet again
            self.sink.put_table("files", self.identities.table())
        self.account.add(batch)
        self.sink.add_events(self.tables.build(batch))

    def flush(self) -> None:
        """Hand the pending tables to the writer thread (one Parquet part)."""
        self.sink.flush()

    # ---- summary ----------------------------------------------------------------------
    def summary(self, totals: dict, hists: dict, end_ns: int, bio_hist=None) -> dict:
        run = RunFacts(pid=self.pid, tid=self.tid, end_reason=self.end_reason, partial_at_start=self.partial_at_start,
                       kswapd_events=self.kswapd_events,
                       missing_evidence=self.plan.missing_columns if self.probe else [],
                       syscall_hook=self._hook_name(), output=self.output, notes=self.notes)
        out = summarize_run(run, self.state, totals, hists, end_ns, bio_hist)
        if self.offcpu is not None:
            out["offcpu"] = self.offcpu.summary()
        if self.faults is not None:
            out["faults"] = self.faults.summary()
        if self.pagecache is not None:
            out["pagecache"] = self.pagecache.summary()
        if self.evictions is not None:
            out["evictions"] = self.evictions.summary()
        if self.sampler is not None:
            try:
                out["context"] = self.sampler.summary()
            except Exception as exc:
                self.notes.append(f"sampler summary failed: {exc}")
        return out
