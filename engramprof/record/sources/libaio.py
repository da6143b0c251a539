"""The libaio source of the recorder: probes/libaio.bpf.c -> read events of kind ``libaio``.

Every read iocb (IOCB_CMD_PREAD, IOCB_CMD_PREADV) a target submits with io_submit is one read
event: ``ts_ns`` its io_submit, ``dur_ns`` submit -> reap (docs/model.md "libaio: timing"),
``tid`` the submitting thread, ``offset``, ``size``, ``ret`` (the io_event's res), ``fd`` (the
iocb's), ``syscall`` = ``io_submit``, ``dev`` / ``ino`` (the file, from the kernel at submit) and
``direct`` (the fd's O_DIRECT), ``bio_count`` / ``bio_ns`` (the bios the submitter queued for
it inside io_submit, and their queue -> complete time).  The other in-flight evidence columns
are not measured by this probe: written null, never a misleading 0.

The scheme of the io_uring source (engramprof/record/sources/uring.py), whose
:class:`~.filepaths.FilePathEnricher` names the (dev, ino): decoder -> path -> tensor -> table.
"""
from __future__ import annotations

import os

import numpy as np

from engramprof.bpf import libaio as aio_probe
from engramprof.host import libaio as aio_needs
from engramprof.record.decode import ReadBatch, WindowStart
from engramprof.record.sources.base import Recording
from engramprof.record.sources.probe import ProbeSource
from engramprof.record.sources.faults import FaultColumns

KIND = aio_probe.KIND  # "libaio"


def user_dev(kernel_dev: np.ndarray) -> np.ndarray:
    """The kernel's dev_t (major << 20 | minor) -> st_dev's encoding (the trace's ``dev``)."""
    kd = kernel_dev.astype(np.int64)
    uniq, inv = np.unique(kd, return_inverse=True)
    return np.array([os.makedev(int(d) >> 20, int(d) & 0xFFFFF) for d in uniq], dtype=np.int64)[inv]


class LibaioDecoder:
    """``struct aio_record`` rows -> :class:`ReadBatch` of kind ``libaio``."""

    kind = KIND

    def __init__(self, armed_ns: int | None, bio: bool = True):
        self.window = WindowStart(armed_ns)
        self.bits = aio_probe.header_defines("AIO_")
        self.bio = bio  # the probe counted and timed bios (HAVE_BIO)

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
            ("ret", i64), ("flags", i64), ("fd", i32), ("dev", np.uint64), ("ino", np.uint64))}
        if self.bio:
            cols["bio_count"], cols["bio_ns"] = recs["bio_count"].astype(i32), recs["bio_ns"].astype(i64)
        cols["syscall"] = np.zeros(n, dtype=i32)  # code 0 of the builder's dictionary: "io_submit"
        af = recs["aflags"].astype(i64)
        out = {"direct": (af & self.bits["DIRECT"]) != 0, "dev": user_dev(recs["dev"]),
               "ino": recs["ino"].astype(i64)}
        return ReadBatch(self.kind, FaultColumns(cols), out)

    @property
    def partial_at_start(self) -> int:
        return self.window.partial_at_start


class LibaioSource(ProbeSource):
    """The libaio probe, its decoder, enrichers and table builder: read events of kind ``libaio``."""

    name = "libaio"
    title = "libaio read iocbs"
    option, needs, label, meta_prefix = "libaio", aio_needs, "libaio", "libaio"
    syscall, probe_module = aio_probe.SYSCALL, aio_probe

    def __init__(self, rec: Recording):
        super().__init__(rec)
        self._noted = False

    def make_probe(self):
        rec = self.rec
        config = aio_probe.LibaioProbeConfig(tgid=rec.pid, tid=rec.tid, selection=rec.selection)
        return aio_probe.LibaioProbe.load(config, arm=False)

    def make_decoder(self) -> "LibaioDecoder":
        return LibaioDecoder(None, self._bio())

    def _bio(self) -> bool:
        return self.probe.plan.features.get("HAVE_BIO", False)

    def measured(self) -> tuple[str, ...]:
        return aio_probe.BIO_COLUMNS if self._bio() else ()

    def summary(self, totals: dict | None = None) -> dict:
        t = totals if totals is not None else self.totals()
        out = {k: t.get(k, 0) for k in ("submitted", "submit_failed", "reaped", "other_thread", "ring_reaped",
                                        "other_iocbs", "not_regular", "no_file", "truncated", "events_truncated",
                                        "chain_broken", "unknown_events",
                                        "replaced", "lost_records", "filtered", "destroyed", "bios",
                                        "bios_untracked")}
        out.update(untracked=t.get("no_state", 0), recorded=self.recorded, partial_at_start=self.partial_at_start,
                   destroyed_inflight=self.probe.destroyed_inflight if self.probe is not None else 0,
                   exited_inflight=self.probe.exited_inflight if self.probe is not None else 0,
                   sum_ms=round(t.get("sum_ns", 0) / 1e6, 3),
                   missing_tracepoints=self.probe.plan.missing if self.probe is not None else [])
        if not self._noted:  # once: the lines go to the recording's notes (summary and meta.json)
            self._noted = True
            self.rec.notes.extend(self.notes(out))
        return out

    def notes(self, s: dict) -> list[str]:
        """The lines a user reads when the libaio traffic was not what it looks like."""
        out = []
        if s["other_iocbs"] and not s["submitted"]:
            out.append(f"libaio: {s['other_iocbs']:,} iocbs of other types (writes, fsync, poll) and no read iocb: "
                       "no libaio read events")
        elif s["other_iocbs"]:
            out.append(f"libaio: {s['other_iocbs']:,} iocbs of other types than PREAD/PREADV (not read events)")
        if s["not_regular"]:
            out.append(f"libaio: {s['not_regular']:,} read iocbs of files that are not regular files "
                       "(pipes, sockets, devices) left out")
        if s["submit_failed"]:
            out.append(f"libaio: {s['submit_failed']:,} read iocbs io_submit did not take (not read events)")
        if s["destroyed_inflight"]:
            out.append(f"libaio: {s['destroyed_inflight']:,} reads were in flight when their context was destroyed "
                       "(io_destroy): never reaped, not read events")
        if s.get("exited_inflight"):
            out.append(f"libaio: {s['exited_inflight']:,} reads were in flight when their process exited: never "
                       "reaped, not read events")
        if s["replaced"]:
            out.append(f"libaio: {s['replaced']:,} reads whose completion was not seen (the iocb submitted again "
                       "before its event was reaped by a syscall or found in the ring)")
        if s["truncated"]:
            out.append(f"libaio: {s['truncated']:,} iocbs beyond the first {aio_probe.MAX_NR} of an io_submit not seen")
        if s.get("events_truncated"):
            out.append(f"libaio: {s['events_truncated']:,} completions beyond the first {aio_probe.MAX_EVENTS} a reap "
                       "returned not read (their reads stay counted as in flight)")
        if s.get("chain_broken"):
            out.append(f"libaio: {s['chain_broken']:,} of the probe's loops over a call's iocbs or events stopped "
                       "early (a tail call failed): the iocbs or events left were not read")
        return out
