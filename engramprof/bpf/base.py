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
from engramprof.bpf import progstats

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

    def skipped_runs(self) -> dict[str, int] | None:
        """{hook: runs of its program the kernel skipped} (another BPF program was running on
        that CPU: engramprof/bpf/progstats.py); None: not counted, or closed."""
        return progstats.skipped_runs(self.bpf) if self.bpf is not None else None

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
