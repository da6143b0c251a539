"""The io_uring source of the recorder: probes/uring.bpf.c -> read events of kind ``io_uring``.

Every read request of a target's ring (READ, READV, READ_FIXED, READV_FIXED) is one read event:
``ts_ns`` its submit, ``dur_ns`` submit -> complete (the CQE posted), ``tid`` the submitting
thread, ``offset``, ``size``, ``ret`` (the CQE's res), ``fd`` (the sqe's fd, or a registered
file's index), ``syscall`` = ``io_uring``, and the io_uring columns ``uring_path`` (inline |
async | punted), ``io_tid`` (the thread that issued the read) and ``direct`` (O_DIRECT).  Of the
in-flight evidence, the page-cache insertions and bios of the thread issuing the request (the
submitter inline, an io-wq worker when punted) and their bio time are the request's; reclaim,
off-CPU and run-queue time are not measured per request (one wait in io_uring_enter serves many):
written null, never a misleading 0.

Followed as data, the scheme of the fault source (engramprof/record/sources/faults.py):

1. :class:`UringDecoder` -- ``struct uring_record`` (engramprof/bpf/uring.py) -> a
   :class:`~.decode.ReadBatch` of kind ``io_uring`` whose records are contiguous columns
   (:class:`~.faults.FaultColumns`);
2. :class:`~.filepaths.FilePathEnricher` -- the file's identity taken in the kernel at the read (device,
   inode; never an fd number, which another file may reuse) -> ``path``: from the target's open
   files (``/proc/PID/fd``), its mappings (``/proc/PID/maps``, the fault source's reading),
   the ``--file`` selection and the kernel's name at the open (the file-name source,
   engramprof/record/sources/names.py: a file opened and closed between two looks at /proc); a
   file none of them names keeps path "" (its dev/ino are the kernel's);
3. the shared :class:`~.enrich.TensorEnricher` and :class:`~.columns.EventTableBuilder`.
"""
from __future__ import annotations


import numpy as np

from engramprof.bpf import uring as uring_probe
from engramprof.host import uring as uring_needs
from engramprof.host.files import st_dev_of
from engramprof.record.decode import ReadBatch, WindowStart
from engramprof.record.sources.probe import ProbeSource
from engramprof.record.sources.faults import FaultColumns

KIND = uring_probe.KIND  # "io_uring"


class UringDecoder:
    """``struct uring_record`` rows -> :class:`ReadBatch` of kind ``io_uring``."""

    kind = KIND

    def __init__(self, armed_ns: int | None):
        self.window = WindowStart(armed_ns)
        self.bits = uring_probe.header_defines("URING_")

    def decode(self, recs: np.ndarray) -> ReadBatch | None:
        if len(recs) == 0:
            return None
        recs = self.window.keep(recs)
        if len(recs) == 0:
            return None
        n = len(recs)
        i64, i32 = np.int64, np.int32
        cols = {name: recs[name].astype(dt) for name, dt in (
            ("ts_ns", i64), ("dur_ns", i64), ("pid", i32), ("tid", i32), ("offset", i64), ("size", i64),
            ("ret", i64), ("flags", i64), ("fd", i32), ("dev", np.uint64), ("ino", np.uint64),
            ("pages_added", i32), ("bio_count", i32), ("bio_ns", i64))}
        cols["syscall"] = np.zeros(n, dtype=i32)  # code 0 of the builder's dictionary: "io_uring"
        uf = recs["uflags"].astype(i64)
        paths = np.asarray(uring_probe.PATHS, dtype=object)
        out = {"uring_path": paths[np.minimum(recs["path"].astype(i64), len(paths) - 1)],
               "io_tid": recs["io_tid"].astype(i32),
               "direct": (uf & self.bits["DIRECT"]) != 0,
               "dev": st_dev_of(recs["dev"].astype(i64)), "ino": recs["ino"].astype(i64)}
        return ReadBatch(self.kind, FaultColumns(cols), out)

    @property
    def partial_at_start(self) -> int:
        return self.window.partial_at_start


class UringSource(ProbeSource):
    """The io_uring probe, its decoder, enrichers and table builder: read events of kind ``io_uring``."""

    name = "uring"
    title = "io_uring read requests"
    option, needs, label, meta_prefix = "uring", uring_needs, "io_uring", "uring"
    syscall, probe_module = KIND, uring_probe

    def make_probe(self):
        rec = self.rec
        config = uring_probe.UringProbeConfig(tgid=rec.pid, tid=rec.tid, selection=rec.selection)
        return uring_probe.UringProbe.load(config, arm=False)

    def make_decoder(self) -> UringDecoder:
        return UringDecoder(None)

    def measured(self) -> tuple[str, ...]:
        """Off-CPU, run-queue and reclaim time are not per request (one wait in io_uring_enter
        serves many); insertions and bios are, where the kernel has their tracepoints."""
        return uring_probe.ISSUE_EVIDENCE if self.probe.plan.features.get("HAVE_ISSUE_EVIDENCE") else ()

    def summary(self, totals: dict | None = None) -> dict:
        t = totals if totals is not None else self.totals()
        return {"submitted": t.get("submitted", 0), "completed": t.get("completed", 0),
                "inline": t.get("inline_n", 0), "async": t.get("async_n", 0), "punted": t.get("punted", 0),
                "sqpoll": t.get("sqpoll", 0), "lost_records": t.get("lost_records", 0),
                "untracked": t.get("no_state", 0), "recorded": self.recorded,
                "bios_untracked": t.get("bios_untracked", 0),  # in bio_count, not in bio_ns (probes/bios.h)
                "nonregular": t.get("nonregular", 0),
                "partial_at_start": self.partial_at_start, "sum_ms": round(t.get("sum_ns", 0) / 1e6, 3),
                "missing_tracepoints": self.probe.plan.missing if self.probe is not None else []}
