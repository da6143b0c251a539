"""The one protocol every part of a recording implements, and what the parts share.

A *source* is one probe's side of the recording (or the samplers'): the recorder
(engramprof/record/recorder.py) drives every registered source (engramprof/record/sources/__init__.py)
through the same steps and never names one:

1. :meth:`Source.available` -- can it record on this kernel, with these options (the reason
   when not: the recorder writes the one "X not traced: why" note);
2. :meth:`Source.load` -- compile the probe (a probe that cannot defer its attach attaches here);
3. :meth:`Source.arm` -- attach what was compiled with the attach deferred: the recording's
   window begins once every source is armed;
4. :meth:`Source.begin_window` -- records that began before the window's start are counted,
   not kept (for the kinds whose early records explain nothing);
5. :meth:`Source.drain` -- what the probe wrote since the last drain, into the sink (the
   first drain after :meth:`Source.detach` is the last: everything left);
6. :meth:`Source.sync_targets` -- the selection's new members into the probe's maps;
7. :meth:`Source.totals`, :meth:`Source.summary` -- the kernel's counts, the summary's part
   (``key``; also written to meta.json);
8. :meth:`Source.close`.

An optional source that fails at any step is closed and left out, with one note; a required
one (the syscall probe) ends the start with its error.  Sources talk to each other only
through the :class:`Recording` they share (the files a read or a mapping brings in, the
processes traced now), never by name.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, ClassVar, NamedTuple

from engramprof.record.live import LiveState
from engramprof.record.sink import TraceSink
from engramprof.record.strings import Interner
from engramprof.target.selection import Selection


class Availability(NamedTuple):
    """Whether a source can record; ``why`` it cannot ("": not asked for, nothing to say)."""

    ok: bool
    why: str = ""


YES = Availability(True)
NOT_ASKED = Availability(False, "")


@dataclass
class Options:
    """What the user asked of the recording (``engramprof syscalls`` / ``diagnose`` options)."""

    min_us: float = 0.0  # record only calls at least this long (all are counted in the kernel)
    sample_hz: float = 10.0  # PSI / vmstat / thread samplers (0: off)
    syscall_hook: str = "auto"  # auto | raw | tracepoint
    offcpu: bool = True  # the target's off-CPU spans (probes/sched.bpf.c)
    faults: bool = True  # page faults on mapped files (probes/faults.bpf.c)
    fault_address: bool = True  # False: fault path without exceptions:page_fault_user
    evictions: bool = True  # evictions of the target's files' pages (probes/evictions.bpf.c)
    uring: bool = True  # io_uring read requests (probes/uring.bpf.c)
    libaio: bool = True  # Linux AIO read iocbs (probes/libaio.bpf.c)
    stack_hz: float = 0.0  # the target's Python stacks with py-spy (0: off; the commands default to 5)


class Recording:
    """What every source of one recording shares: the selection (the one place the target is
    named), the options, the notes, the string dictionaries, the live aggregates, the writer
    and the sink, and how the run ended."""

    def __init__(self, selection: Selection, options: Options | None = None, output: str | None = None):
        self.selection = selection
        self.options = options or Options()
        self.output = output
        self.notes: list[str] = []
        self.paths = Interner("")
        self.tensors = Interner("")
        self.state = LiveState()
        self.writer = None  # engramprof.trace.TraceWriter with --output
        self.sink = TraceSink(None, self.notes)
        self.end_reason = "running"
        self.end_ns: int | None = None  # the recording's end (the required source's detach)
        #: the processes traced now (the recorder's: every source's); for the samplers
        self.traced_tgids: Callable[[], set[int]] = lambda: set(self.selection.pids)
        self._file_watchers: list = []
        #: more log2(ns) bio histograms of the target (the fault probe's), summed with the
        #: syscall probe's into tables/bio_latency_log2; each a callable, None when unknown
        self.bio_histograms: list[Callable] = []
        #: the file-name probe (engramprof/bpf/names.py's NamesProbe) while it is loaded: names
        #: for identities /proc did not name
        self.kernel_names = None

    def kernel_file_name(self, pid: int, dev: int, ino: int) -> str | None:
        """The path the kernel gave identity (dev, ino) when ``pid`` opened it; None: unknown."""
        names = self.kernel_names
        return names.name(pid, dev, ino) if names is not None else None

    @classmethod
    def of(cls, target, **options) -> "Recording":
        """A recording's shared state for a pid or a Selection (tests drive one source with it)."""
        return cls(Selection.of(target), Options(**options))

    @property
    def pid(self) -> int:
        """The first selected process (0: --file or --cgroup alone)."""
        return self.selection.first_pid

    @property
    def tid(self) -> int:
        return self.selection.tid

    def put_meta(self, **kw) -> None:
        """Into meta.json (with --output), at the next write of it."""
        if self.writer is not None:
            self.writer.update_meta(**kw)

    # ---- the files the traced processes read (one source sees them, another watches them) --
    def watch_files(self, watcher) -> None:
        """``watcher.files_read(recs, path_codes)`` and ``watcher.files_mapped(per_pid)`` are
        called for every batch of reads and every refreshed set of mappings from now on."""
        self._file_watchers.append(watcher)

    def unwatch_files(self, watcher) -> None:
        if watcher in self._file_watchers:
            self._file_watchers.remove(watcher)

    def files_read(self, recs, path_codes) -> None:
        """A batch of reads (its records and path codes): a file read for the first time."""
        for w in list(self._file_watchers):
            w.files_read(recs, path_codes)

    def files_mapped(self, per_pid) -> None:
        """The traced processes' mappings (a PerPid of mapping enrichers) after a drain."""
        for w in list(self._file_watchers):
            w.files_mapped(per_pid)


class Source(ABC):
    """One part of a recording: a probe (or the samplers) with its decoders, driven by the
    recorder through the steps of this class.  Subclasses name themselves in class attributes."""

    #: the recorder's attribute for it (``recorder.faults``) and the summary / meta.json key
    name: ClassVar[str]
    #: more attribute names it answers to (a reader of an older name)
    aliases: ClassVar[tuple[str, ...]] = ()
    #: what it records, for the note when it does not: "<title> <absent>: <why>"
    title: ClassVar[str]
    absent: ClassVar[str] = "not traced"
    #: a required source's failure ends the start (and its summary is the summary's top level)
    required: ClassVar[bool] = False
    #: meta.json keys when it does not record (readers tell "off" from "older bundle")
    absent_meta: ClassVar[dict] = {}
    #: drained between the later sources' loads: its records from before the window are kept
    #: and its ring fills while the other probes compile
    drain_while_loading: ClassVar[bool] = False

    def __init__(self, rec: Recording):
        self.rec = rec

    # ---- the protocol -----------------------------------------------------------------
    @abstractmethod
    def available(self) -> Availability:
        """Whether it can record (kernel, options, selection); the reason when not."""

    @abstractmethod
    def load(self) -> None:
        """Compile the probe (attached here only by a source that cannot defer it)."""

    @abstractmethod
    def arm(self) -> None:
        """Attach what :meth:`load` compiled; every source is armed before the window begins."""

    @abstractmethod
    def begin_window(self, start_ns: int) -> None:
        """The recording's window begins at ``start_ns`` (every source armed)."""

    @abstractmethod
    def drain(self, sink) -> None:
        """Everything written since the last drain, into ``sink``; after :meth:`detach`, all."""

    @abstractmethod
    def sync_targets(self) -> None:
        """New members of the selection (a v2 cgroup's sub-groups, ...) into the probe's maps."""

    @abstractmethod
    def totals(self) -> dict[str, int]:
        """The kernel's counts now (the last reading once closed)."""

    @abstractmethod
    def summary(self) -> dict | None:
        """Its part of the summary (and of meta.json) under :attr:`name`; None: nothing."""

    @abstractmethod
    def close(self) -> None:
        """Release the probe; safe after a failed :meth:`load` and when called twice."""

    # ---- steps with a default ---------------------------------------------------------
    def start_meta(self) -> dict:
        """meta.json keys known before anything is loaded (the writer is created with them)."""
        return {}

    def detach(self) -> int | None:
        """Stop recording (the maps stay readable until :meth:`close`); the next drain is the
        last.  A required source returns when its recording ended (the recording's end)."""
        return None

    def snapshot(self, sink) -> dict:
        """About once a second with --output: the tables to rewrite (into ``sink``) and the
        meta.json keys to update (returned), so that a ``kill -9`` loses at most a second."""
        return {}

    def closing_meta(self, summary: dict | None) -> dict:
        """meta.json keys written when the bundle is closed (``summary``: its :meth:`summary`)."""
        return {} if summary is None else {self.name: summary}

    def skipped_runs(self) -> dict[str, int] | None:
        """{hook: runs the kernel skipped} of its probe's programs (engramprof/bpf/progstats.py),
        readable until :meth:`close`; None: no probe, or not counted."""
        probe = getattr(self, "probe", None)
        return probe.skipped_runs() if probe is not None and getattr(probe, "bpf", None) is not None else None

    def live_targets(self) -> list[int] | None:
        """The processes in the probe's map of targets (fork adds, group death removes), when
        it keeps one for the recording's end; None: it does not."""
        return None

    def seen_tgids(self) -> set[int]:
        """The processes it has seen (read events, mappings)."""
        return set()


def sync_probe_targets(probe) -> None:
    """A loaded probe's target maps brought in step with the selection (nothing once closed)."""
    if probe is not None and getattr(probe, "bpf", None) is not None:
        probe.targets.sync()
