"""Decoders: one per probe record kind, from ring-buffer records to what the pipeline carries."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from engramprof import trace
from engramprof.bpf import structs as layout
from engramprof.host.files import st_dev_of


@dataclass
class ReadBatch:
    """Read events of one kind from one drain: the decoded records (columnar, a numpy
    structured array) plus the columns the enrichers add (numpy arrays, one value per row)."""

    kind: str
    recs: np.ndarray
    cols: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.recs)


class WindowStart:
    """The recording's window start for one record kind: records that began before it (a call,
    a fault, an off-CPU span under way when the probes were armed) lack evidence gathered by
    hooks armed after them, so each decoder drops them and counts them (``partial_at_start``).
    ``start_ns`` is raised to the window's start once every probe is armed."""

    def __init__(self, start_ns: int | None = None, field: str = "ts_ns"):
        self.start_ns = start_ns or 0
        self.field = field
        self.partial_at_start = 0

    def begin(self, start_ns: int) -> None:
        self.start_ns = max(self.start_ns, start_ns)

    def keep(self, recs: np.ndarray) -> np.ndarray:
        """``recs`` without the records that began before the window (counted)."""
        early = recs[self.field] < self.start_ns
        if early.any():
            self.partial_at_start += int(early.sum())
            recs = recs[~early]
        return recs


def syscall_names() -> list[str]:
    """Syscall names by code, from the header's SYSCALL_* defines."""
    codes = layout.header_defines("SYSCALL_")
    names = [""] * (max(codes.values()) + 1)
    for name, code in codes.items():
        names[code] = name.lower()
    return names


def file_columns(recs: np.ndarray) -> dict[str, np.ndarray]:
    """The trace's ``dev`` (st_dev form), ``ino`` and ``direct`` of call records: the file the
    kernel walked to at entry (0/0 when it could not: a closed fd; written null)."""
    known = recs["ino"] != 0
    dev = st_dev_of(recs["dev"].astype(np.int64))
    ino = recs["ino"].astype(np.int64)
    if known.all():
        return {"dev": dev, "ino": ino, "direct": recs["direct"] != 0}
    masked = lambda v: np.ma.masked_array(v, mask=~known)  # noqa: E731  (null in the table)
    return {"dev": masked(dev), "ino": masked(ino), "direct": masked(recs["direct"] != 0)}


class CallDecoder:
    """``struct call_record`` -> :class:`ReadBatch` of kind ``syscall``.

    Records of calls that entered before the probe was fully armed (``armed_ns``) lack evidence
    gathered by the hooks attached after them: they are dropped and counted."""

    kind = "syscall"

    def __init__(self, record: np.dtype, armed_ns: int):
        trace.check_record_columns(record)  # the header struct and CALL_SCHEMA are one list
        self.record = record
        self.window = WindowStart(armed_ns)
        names = syscall_names()
        self.syscall_dictionary = pa.array(names, type=pa.string())
        self.max_syscall = len(names) - 1

    def decode(self, recs: np.ndarray) -> ReadBatch | None:
        if len(recs) == 0:
            return None
        recs = self.window.keep(recs)
        if len(recs) == 0:
            return None
        return ReadBatch(self.kind, recs, file_columns(recs))

    @property
    def partial_at_start(self) -> int:
        return self.window.partial_at_start

    @property
    def armed_ns(self) -> int:
        return self.window.start_ns

    @armed_ns.setter
    def armed_ns(self, ns: int) -> None:
        self.window.start_ns = ns


class VmEventDecoder:
    """``struct vm_event`` (kswapd wake / sleep, system-wide) -> ``kswapd_events`` sample rows."""

    def __init__(self):
        self.wake = layout.header_define("VM_KSWAPD_WAKE")
        self.events = 0

    def decode(self, ev: np.ndarray) -> pa.Table | None:
        if len(ev) == 0:
            return None
        self.events += len(ev)
        return trace.kswapd_events_table(ev["ts_ns"], ev["nid"], ev["kind"] == self.wake)


class LostRecords:
    """A probe's kernel count of records dropped because its ring was full, as rows of its
    ``*_lost`` sample (start_ns, end_ns, lost: the ``lost_records`` schema): one row per drain
    that saw the count grow, spanning the time since the drain before (where the hole is)."""

    def __init__(self, sample: str, checked_ns: int = 0):
        self.sample = sample
        self.seen = 0  # the kernel's count at the last check
        self.checked_ns = checked_ns  # when it was read (the probe's arming, before the first)
        self.intervals = 0  # rows written

    def check(self, sink, lost: int) -> None:
        now = time.monotonic_ns()
        if lost > self.seen:
            sink.add_samples(self.sample, trace.lost_records_table([self.checked_ns], [now], [lost - self.seen]))
            self.intervals += 1
            self.seen = lost
        self.checked_ns = now


def drain_into(sink, probe, recs: np.ndarray | None, decoders, lost: LostRecords, *,
               window: WindowStart | None) -> None:
    """One drain step of a recorder of a ring probe: ``recs`` (what it drained from the ring;
    None: the ring was not due this time, see DrainBatching) without the records that began
    before ``window`` (counted there), each ``(sample, decode)`` of ``decoders`` appending its
    table (None: nothing) to the sink, then the probe's lost count checked (``lost``).

    ``window`` is explicit on purpose: ``None`` keeps the records from before the recording's
    window start, for the kinds whose early records still explain what happens inside it (an
    eviction before the window explains a miss in it)."""
    if recs is not None:
        if window is not None and len(recs):
            recs = window.keep(recs)
        for sample, decode in decoders:
            table = decode(recs)
            if table is not None:
                sink.add_samples(sample, table)
    lost.check(sink, probe.lost_records())


class ProbeTotals:
    """The recorders' ``totals()``: their loaded probe's (``self.probe``) totals now, or the
    reading before (``self._totals``) once it is closed (``probe`` None or its ``bpf`` gone) or
    when the maps cannot be read: context, never an error."""

    _totals: dict[str, int]

    def totals(self) -> dict[str, int]:
        probe = self.probe
        if probe is not None and probe.bpf is not None:
            try:
                self._totals = probe.totals()
            except Exception:  # context: keep the last reading
                pass
        return dict(self._totals)


class DrainBatching:
    """When a ring is worth draining: every drain pays a fixed cost (the numpy and Arrow calls
    of the pipeline, a few hundred µs) whatever it holds, which at the recorder's 50 ms tick
    and a few hundred faults a tick is most of the collector's CPU.  A ring is drained once it
    holds ``records`` records or ``every_s`` has passed since the last drain (and always after
    the probe is detached: ``final``).  The ring's capacity (~140k faults) covers ``every_s``
    of a fault rate well above what a reader sustains."""

    def __init__(self, every_s: float = 0.25, records: int = 4096):
        self.every_ns = int(every_s * 1e9)
        self.records = records
        self.final = False
        self._last = time.monotonic_ns()

    def due(self, ring) -> bool:
        now = time.monotonic_ns()
        if self.final or now - self._last >= self.every_ns or ring.pending_bytes() >= self.records * ring.slot:
            self._last = now
            return True
        return False
