"""The recorder behind ``engramprof syscalls`` and ``diagnose``: one loop over its sources.

Every part of a recording (the read calls, page faults, evictions, page-cache insertions,
off-CPU spans, samplers) is a source (engramprof/record/sources/) implementing one protocol
(engramprof/record/sources/base.py); the recorder drives them all the same way and never
names one:

- :meth:`Recorder.start`: every source says whether it can record (the one "X not traced:
  why" note when not), the trace writer is created, the sources load in the registry's order
  (engramprof/record/sources/__init__.py), are armed together, and the window begins;
- :meth:`Recorder.run`: every ``DRAIN_S`` each source drains into the sink (the pipeline of
  engramprof/record: decoder -> enrichers -> Arrow table -> trace writer, one Parquet part per
  second, so memory stays flat however long it runs); about once a second the pending tables
  are flushed, the kernel's state snapshot, the targets synced and the live view ticked;
- :meth:`Recorder.finish`: detach, drain what is left, write the closing metadata, close.

It ends on: the duration, SIGINT/SIGTERM (the caller sets ``stop``), the target's exit
(pidfd becomes readable), or a write that fails (disk full: ``end_reason`` ``disk-full``,
``disk-quota``, ``disk-io-error``).  In every case the trace is closed cleanly: the parts
written before stay loadable and meta.json gets the kernel's totals.

Crash safety (``kill -9`` at any moment): parts appear atomically (engramprof/trace/writer.py),
and everything is flushed about once a second -- events, samples, lost-record intervals, the
kernel's histograms (a snapshot), the traced files' identities, and the running totals in
meta.json -- so a killed recorder loses at most the last second.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa

from engramprof import trace
from engramprof.bpf import progstats
from engramprof.bpf import targets as target_maps
from engramprof.errors import UserError
from engramprof.host.interpreter import runs_cpython
from engramprof.record.live import FileStat, LatencyHist, LiveAccount, LiveState  # noqa: F401 (re-exported)
from engramprof.record.sources import SOURCES, Options, Recording, Source
from engramprof.target.process import ExitWatch, check_privileges, check_target, cmdline, pid_state
from engramprof.target.selection import Selection

DRAIN_S = 0.05
FLUSH_S = 1.0
HIST_FLUSH_S = 1.0  # snapshot of the kernel's histograms into tables/ (replaced each time)


def process_meta(pid: int) -> dict:
    """A selected process in the bundle's meta: its command line, and whether it runs a CPython
    interpreter (``cpython``: true / false / null, ``cpython_evidence``: why; analysis/thread_kinds
    takes every thread of a process that does not as native)."""
    cpython, why = runs_cpython(pid)
    return {"pid": pid, "cmdline": cmdline(pid), "cpython": cpython, "cpython_evidence": why}


class Recorder:
    """Runs a recording of its sources: :meth:`start`, :meth:`run`, :meth:`finish`.

    ``target``: a pid or a :class:`~engramprof.target.selection.Selection` (--pid repeated,
    --children, --cgroup, --file), named once here and shared by every source.  ``options``:
    the fields of :class:`~engramprof.record.sources.base.Options` (``min_us``, ``sample_hz``,
    ``syscall_hook``, ``offcpu``, ``faults``, ``fault_address``, ``evictions``; None: the
    default).  A source in play is an attribute of its name (``recorder.faults``; None when it
    does not record)."""

    def __init__(self, target: "int | Selection", tid: int = 0, output: str | None = None,
                 argv: list[str] | None = None, sources: list[type[Source]] | None = None, **options):
        selection = Selection.of(target)
        if isinstance(target, Selection):
            tid = target.tid
        selection.tid = tid
        self.selection = selection
        self.rec = Recording(selection, Options(**{k: v for k, v in options.items() if v is not None}), output)
        self.rec.traced_tgids = self.traced_tgids
        self.output = output
        self.argv = argv or []
        self.stop = threading.Event()
        #: test hook: while set, run() does not drain (the rings fill up and records are lost)
        self.pause_draining = threading.Event()
        if selection.files and (matched := selection.matched_note()):
            self.notes.append(matched)  # e.g. an overlayfs file: its real file's inode too
        self._classes = list(SOURCES if sources is None else sources)
        #: the sources in play, in the registry's order (one that fails is left out)
        self.sources: list[Source] = [cls(self.rec) for cls in self._classes]
        self._absent: list[type[Source]] = []  # registered, not recording
        #: the required source once loaded (None before, or when the start failed)
        self.primary: Source | None = None
        self._exit: list[ExitWatch] = []
        self._targets_checked = 0.0
        self.write_error: str | None = None
        self.meta_error: str | None = None

    # ---- what the sources share, and the sources by name --------------------------------
    notes = property(lambda self: self.rec.notes)
    state = property(lambda self: self.rec.state)
    sink = property(lambda self: self.rec.sink)
    writer = property(lambda self: self.rec.writer)
    pid = property(lambda self: self.selection.first_pid)
    tid = property(lambda self: self.selection.tid)
    #: the live view and the command read the required source's totals (and its plan)
    probe = property(lambda self: self.primary)
    plan = property(lambda self: getattr(self.primary, "plan", None))

    @property
    def end_reason(self) -> str:
        return self.rec.end_reason

    @end_reason.setter
    def end_reason(self, why: str) -> None:
        self.rec.end_reason = why

    def __getattr__(self, name: str):
        """``recorder.<source name>``: that source when it records, else None."""
        classes = self.__dict__.get("_classes")
        if classes is None or name.startswith("_"):
            raise AttributeError(name)
        for cls in classes:
            if name == cls.name or name in cls.aliases:
                return next((s for s in self.__dict__["sources"] if type(s) is cls), None)
        raise AttributeError(name)

    # ---- life cycle -------------------------------------------------------------------
    def start(self) -> None:
        # Arrow's default (mimalloc) pool keeps freed batches mapped: over a long trace the
        # collector's RSS creeps up; the system allocator returns them (measured flat, see README)
        pa.set_memory_pool(pa.system_memory_pool())
        for t in self.selection.pids:
            check_target(t, self.tid)
        check_privileges()
        for s in list(self.sources):
            ok, why = s.available()
            if not ok:
                if s.required:
                    raise UserError(f"{s.title} {s.absent}: {why}", code=1)
                self._leave_out(s, why)
        self._exit = [ExitWatch(t) for t in self.selection.pids]
        if self.output:
            self.rec.writer = trace.TraceWriter(self.output, meta=self._meta())
            self.sink.writer = self.rec.writer
        self._load()
        for s in list(self.sources):  # compiled one after the other, attached together now
            self._step(s, s.arm)
        self.state.started_ns = start_ns = time.monotonic_ns()
        if self.writer:
            self.writer.update_meta(start_ns=start_ns)
            self.writer.flush_meta()
        for s in list(self.sources):  # every source armed: the recording's window begins
            self._step(s, s.begin_window, start_ns)

    def _load(self) -> None:
        """Each source in the registry's order; the ones that keep their records from before
        the window are drained between the others' loads (their rings fill meanwhile)."""
        loaded: list[Source] = []
        for s in list(self.sources):
            try:
                s.load()
            except BaseException as exc:
                if s.required or not isinstance(exc, Exception):
                    self._abort(loaded + [s])
                    raise
                self._drop(s, exc)
                continue
            if s.required:
                self.primary = s
            for earlier in loaded:
                if earlier.drain_while_loading and earlier in self.sources:
                    self._step(earlier, earlier.drain, self.sink)
            loaded.append(s)

    def _abort(self, loaded: list[Source]) -> None:
        """A required source failed to load: release what is loaded and leave a closed,
        loadable (empty) bundle that says why."""
        for s in loaded:
            try:
                s.close()
            except Exception:
                pass
        self.sources = []
        if self.writer:
            self.writer.close(end_reason="probe load failed", end_ns=time.monotonic_ns())

    def _step(self, s: Source, step, *args) -> bool:
        """One step of an optional source: on failure it is closed and left out, with a note."""
        try:
            step(*args)
            return True
        except Exception as exc:
            if s.required:
                raise
            self._drop(s, exc)
            return False

    def _drop(self, s: Source, exc: BaseException) -> None:
        try:
            s.close()
        except Exception:  # what it half loaded: nothing more to do for it
            pass
        self._leave_out(s, str(exc))

    def _leave_out(self, s: Source, why: str) -> None:
        """The one place a source that does not record is noted: "<what> not traced: <why>"."""
        if s in self.sources:
            self.sources.remove(s)
        self._absent.append(type(s))
        if why:
            self.notes.append(f"{s.title} {s.absent}: {why}")
        if self.writer and type(s).absent_meta:
            self.writer.update_meta(**type(s).absent_meta)

    def _meta(self) -> dict:
        pid = self.pid
        meta = {
            # pid: the first selected process (older readers); pids and selection: everything
            "pid": pid or None, "tid": self.tid or None, "target_cmdline": cmdline(pid) if pid else "",
            **self.selection.meta(),
            "processes": [process_meta(p) for p in self.selection.pids],
            "engramprof_argv": self.argv,
        }
        for s in self.sources:
            meta.update(s.start_meta())
        return meta

    def traced_tgids(self) -> set[int]:
        """The processes traced now, for the per-thread samplers (their thread): the --pid ones,
        what the kernel's map holds (--children's forks, a v1 cgroup's members), a v2 cgroup's
        members, and every process a read event came from (--file's readers)."""
        s = self.selection
        out = set(s.pids)
        for src in list(self.sources):
            out |= src.seen_tgids()
        if s.cgroups_v2:
            out |= s.v2_members()
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
        live = next((t for t in (s.live_targets() for s in self.sources) if t is not None), [])
        return not any(pid_state(t) not in (None, "Z", "X") for t in live)

    def sync_targets(self) -> None:
        """New sub-groups of a v2 cgroup, the processes of a v1 cgroup, an overlay --file's copy-up:
        into every source's maps."""
        if not target_maps.needs_sync(self.selection):
            return
        for s in self.sources:
            try:
                s.sync_targets()
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

    def _end_order(self) -> list[Source]:
        """The required source first: the recording ends when its hooks are gone."""
        return sorted(self.sources, key=lambda s: not s.required)

    def finish(self) -> dict:
        """Detach, drain what is left, write the closing metadata; return the summary."""
        end_ns = time.monotonic_ns()
        if self.primary is not None:
            first, *rest = self._end_order()
            ended = first.detach()  # the required source first: its hooks gone, the recording ends
            if first.required and ended:
                end_ns = ended
            if rest:  # the others together: each close waits for RCU grace periods (bpf/base.py)
                with ThreadPoolExecutor(max_workers=len(rest)) as ex:
                    list(ex.map(lambda s: s.detach(), rest))
        self.rec.end_ns = end_ns
        if self.primary is not None:
            self.drain()  # the last: everything the probes wrote
        self.flush()
        self.sink.close()
        if self.write_failed():
            if self.end_reason in ("running", *trace.END_REASONS) or not self.end_reason:
                self.end_reason = self.writer.failed[0] if self.writer.failed else "write-error"
            self.write_error = self.writer.failed[1] if self.writer.failed else str(self.sink.failed)
            self.notes.append(f"recording stopped: {self.write_error}; the kernel's totals count every call, "
                              f"{self.sink.dropped_rows:,} recorded calls could not be written")
        parts = {s: s.summary() for s in self._end_order()}
        summary: dict = {}
        for s, part in parts.items():
            if s.required:
                summary.update(part or {})
            elif part is not None:
                summary[s.name] = part
        summary["kernel_skipped"] = skipped = self.kernel_skipped()
        if self.writer:
            self._close_writer(end_ns, parts, skipped)
        for s in self._end_order():
            s.close()
        for w in self._exit:
            w.close()
        return summary

    def kernel_skipped(self) -> dict:
        """The runs of every source's programs the kernel skipped so far (bpf/progstats.py)."""
        return progstats.summarize({s.name: s.skipped_runs() for s in self.sources})

    def _close_writer(self, end_ns: int, parts: dict, skipped: dict) -> None:
        meta: dict = {"kernel_skipped": skipped}
        for cls in self._absent:
            meta.update(cls.absent_meta)
        for s, part in parts.items():
            meta.update(s.closing_meta(part))
        try:
            self.writer.close(end_ns=end_ns, end_reason=self.end_reason, notes=self.notes,
                              calls_not_written=self.sink.dropped_rows, **meta)
        except OSError as exc:  # not even meta.json fits: the parts written stay loadable
            self.meta_error = f"{type(exc).__name__}: {exc}"

    def snapshot_kernel_state(self) -> None:
        """Every source's kernel state so far, to tables/ and meta.json (kill -9 safety)."""
        if self.writer is None or self.primary is None or self.sink.failed is not None:
            return
        meta: dict = {"kernel_skipped": self.kernel_skipped()}
        for s in self.sources:
            meta.update(s.snapshot(self.sink))
        self.sink.put_meta(**meta, notes=list(self.notes))

    # ---- data path --------------------------------------------------------------------
    def drain(self) -> None:
        """One pass over the sources: everything their probes wrote since the last, into the sink."""
        for s in self.sources:
            s.drain(self.sink)

    def flush(self) -> None:
        """Hand the pending tables to the writer thread (one Parquet part)."""
        self.sink.flush()
