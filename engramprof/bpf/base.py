"""What every loaded BCC probe object shares: compiling the program text, reading its per-CPU
totals, detaching its programs and closing it.

Each probe module (engramprof/bpf/syscalls.py, evictions.py, faults.py, sched.py, pagecache.py,
engramprof/export/probe.py) subclasses :class:`LoadedBpf` and names what differs as class
attributes: the totals map, the totals fields that are a maximum over CPUs and not a sum, the
field counting records lost to a full ring.  What is a probe's own (its plan, its maps' layout
checks, watched files, histograms) stays in its module.
"""
from __future__ import annotations

import contextlib
import os
import time
from concurrent.futures import ThreadPoolExecutor

from engramprof.errors import UserError

#: clang flags of every probe: the constants are #defines written ahead of the source (some
#: redefine a header default), and the header's helpers are not all used by every probe
CFLAGS = ["-Wno-macro-redefined", "-Wno-unused-function"]


@contextlib.contextmanager
def quiet_stderr():
    """BCC/clang print header warnings on fd 2; keep them off the user's terminal."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as dn:
            os.dup2(dn.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def import_bcc():
    try:
        from bcc import BPF  # noqa: F401
    except ImportError:
        raise UserError("BCC is not importable: install python3-bpfcc (`make setup`) and use a venv made with "
                        "--system-site-packages", code=1) from None
    return BPF


def compile_program(BPF, text: str, what: str, hint: str = ""):
    """``BPF(text=...)`` with clang's warnings kept off the terminal (unless ENGRAMPROF_DEBUG);
    a failure is a one-line :class:`UserError` naming ``what`` (``"page-fault probe"``), with
    ``hint`` after the `engramprof doctor` advice."""
    try:
        with (quiet_stderr() if not os.environ.get("ENGRAMPROF_DEBUG") else contextlib.nullcontext()):
            return BPF(text=text.encode(), cflags=CFLAGS)
    except Exception as exc:  # BCC raises bare Exception on compile/load failure
        raise UserError(f"cannot load the {what} ({exc}); run `engramprof doctor`{hint}", code=1) from None


#: threads closing a probe's hooks together (see :func:`detach_together`)
DETACH_THREADS = 32


def detach_together(b, raw: list = (), tracepoints: list = ()) -> None:
    """Detach BCC programs from raw tracepoints, then from tracepoints, each group closed from
    threads at once.  Closing a hook's perf event or link waits for an RCU grace period (about
    60 ms on this kernel): one after the other, a recorder's 99 hooks took 6 s to end; closed
    together (ctypes and os.close release the GIL) their grace periods overlap."""
    for group, detach in ((list(raw), b.detach_raw_tracepoint), (list(tracepoints), b.detach_tracepoint)):
        if len(group) <= 1:
            for n in group:
                detach(n)
            continue
        with ThreadPoolExecutor(max_workers=min(DETACH_THREADS, len(group))) as ex:
            list(ex.map(detach, group))  # list(): the first failure is raised here


class LoadedBpf:
    """A compiled BCC object (``self.bpf``) with its record ring (``self.ring``) and a per-CPU
    totals array of one struct.  ``bpf`` is None once closed."""

    #: the BPF_PERCPU_ARRAY holding the probe's totals (one struct, at index 0)
    totals_map: str = ""
    #: totals fields that are a maximum over CPUs (summing them means nothing)
    max_fields: tuple[str, ...] = ()
    #: the totals field counting records the kernel dropped because the ring was full
    lost_field: str = "lost_records"

    bpf = None
    ring = None

    def totals_fields(self) -> tuple[str, ...]:
        """The fields of the totals struct, in order (the layout parsed from the probe's source)."""
        return self.totals_dtype.names

    def totals(self) -> dict[str, int]:
        """The totals struct summed over CPUs (:attr:`max_fields`: the largest CPU's value)."""
        per_cpu = self.bpf[self.totals_map][0]
        out = {}
        for name in self.totals_fields():
            vals = [getattr(v, name) for v in per_cpu]
            out[name] = max(vals) if name in self.max_fields else sum(vals)
        return out

    def lost_records(self) -> int:
        """The kernel's count of records dropped because the ring was full (all CPUs)."""
        return sum(getattr(v, self.lost_field) for v in self.bpf[self.totals_map][0])

    def detach(self) -> int | None:
        """Stop the programs (raw tracepoints, then tracepoints); the maps stay readable until
        close().  Returns the CLOCK_MONOTONIC ns at which they were gone (None: closed)."""
        b = self.bpf
        if b is None:
            return None
        detach_together(b, list(getattr(b, "raw_tracepoint_fds", {})), list(getattr(b, "tracepoint_fds", {})))
        return time.monotonic_ns()

    def rings(self) -> list:
        """The ring readers close() closes."""
        return [self.ring]

    def close(self) -> None:
        if self.bpf is None:
            return
        for ring in self.rings():
            ring.close()
        self.bpf.cleanup()
        self.bpf = None


class DeferredProbe(LoadedBpf):
    """A probe compiled with its attach deferred (engramprof/bpf/sched.py's ``deferred_bpf``):
    :meth:`arm` attaches every program at once and says when.  ``what`` names it in errors."""

    what: str = "probe"
    armed_ns: int | None = None

    def arm(self) -> int:
        """Attach the programs; returns when they were attached (CLOCK_MONOTONIC ns).  A read
        begun before that instant is never recorded (it is not in the in-flight map)."""
        from engramprof.bpf.sched import attach_all

        if self.armed_ns is None:
            try:
                attach_all(self.bpf)
            except Exception as exc:
                raise UserError(f"cannot attach the {self.what} ({exc}); run `engramprof doctor`", code=1) from None
            self.armed_ns = time.monotonic_ns()
        return self.armed_ns


class RequestProbe(DeferredProbe):
    """A read-path probe (io_uring, libaio: engramprof/bpf/uring.py, libaio.py): compiled from
    its plan with the target maps filled, its record and totals structs checked against what
    clang compiled (the ``<struct>_layout`` maps), and one ring of records.  A subclass names
    :attr:`record_struct`, :attr:`totals_struct`, :attr:`ring_map` and gives :meth:`make_plan`,
    :meth:`program_text` and :meth:`struct_dtype` (its module's)."""

    record_struct: str = ""
    totals_struct: str = ""
    ring_map: str = ""

    def __init__(self, p, arm: bool = True):
        from engramprof.bpf import structs as layout
        from engramprof.bpf import targets
        from engramprof.bpf.ringbuf import RingBufferReader
        from engramprof.bpf.sched import deferred_bpf

        BPF = import_bcc()
        self.plan = p
        self.text = self.program_text(p)
        self.record_dtype = self.struct_dtype(self.record_struct)
        self.totals_dtype = self.struct_dtype(self.totals_struct)
        self.bpf = compile_program(deferred_bpf(BPF), self.text, self.what)
        self.targets = targets.TargetMaps(self.bpf, p.config.selection)  # before arming: maps filled
        self.armed_ns = None
        layout.check_against_compiled(self.record_dtype, self.bpf[f"{self.record_struct}_layout"].Leaf)
        layout.check_against_compiled(self.totals_dtype, self.bpf[f"{self.totals_struct}_layout"].Leaf)
        page = os.sysconf("SC_PAGE_SIZE")
        self.ring = RingBufferReader(self.bpf[self.ring_map].map_fd, p.config.ring_pages * page, self.record_dtype)
        if arm:
            self.arm()

    @staticmethod
    def make_plan(config, tracefs_root=None):
        raise NotImplementedError

    @staticmethod
    def program_text(p) -> str:
        raise NotImplementedError

    @staticmethod
    def struct_dtype(name: str):
        raise NotImplementedError

    @classmethod
    def load(cls, config, arm: bool = False, tracefs_root=None):
        """Plan (tracefs, BTF) and compile; attached only with ``arm=True`` or :meth:`arm`."""
        return cls(cls.make_plan(config, tracefs_root), arm=arm)

    def drain(self):
        """Every record written since the last drain (record struct rows), oldest first."""
        return self.ring.drain()
