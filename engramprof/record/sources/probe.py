"""The read-path probes' source base (io_uring requests, libaio iocbs): one loaded probe whose
ring of read records goes decoder -> (device, inode) -> path -> tensor -> Arrow table -> sink.
"""
from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import pyarrow as pa

from engramprof.host import tracepoints as tp
from engramprof.record.columns import EventTableBuilder
from engramprof.record.decode import DrainBatching, LostRecords, ProbeTotals
from engramprof.record.enrich import PerPid, TensorEnricher
from engramprof.record.sources.base import NOT_ASKED, YES, Availability, Recording, Source, sync_probe_targets
from engramprof.record.sources.filepaths import FilePathEnricher
from engramprof.trace import EVIDENCE_COLUMNS


class ProbeSource(Source):
    """A read-path probe's source (io_uring requests, libaio iocbs): one loaded probe whose
    ring of read records goes decoder -> (device, inode) -> path -> tensor -> Arrow table ->
    sink.  A subclass names what differs: :attr:`option` (the Options flag), :attr:`needs` (the
    module whose ``missing_tracepoints(root)`` and ``btf_status()`` say what the kernel lacks),
    :attr:`label` (its notes' prefix), :attr:`meta_prefix` (its meta.json keys),
    :attr:`probe_module`, and
    :meth:`make_probe`, :meth:`make_decoder`, :attr:`syscall` (the events' ``syscall``) and
    :meth:`measured` (the evidence columns its records carry; the others are written null)."""

    option: ClassVar[str]
    needs: ClassVar[object]
    label: ClassVar[str]
    meta_prefix: ClassVar[str]
    syscall: ClassVar[str]
    #: the engramprof/bpf module of its probe (its PROBE_FILE goes to meta.json)
    probe_module: ClassVar[object]

    def __init__(self, rec: Recording):
        super().__init__(rec)
        self.probe = None
        self.decoder = None
        self.files = None  # PerPid of FilePathEnricher
        self.recorded = 0
        self.batching = DrainBatching()
        self.lost = LostRecords("lost_records")
        self._totals: dict[str, int] = {}

    # ---- what a subclass names --------------------------------------------------------
    @abstractmethod
    def make_probe(self):
        """The probe compiled, not attached (its ``plan.missing``, ``armed_ns``, ``arm()``)."""

    @abstractmethod
    def make_decoder(self):
        """Its records -> ReadBatch (with a ``window`` and ``partial_at_start``)."""

    @abstractmethod
    def measured(self) -> tuple[str, ...]:
        """The in-flight evidence columns its records carry."""

    # ---- the protocol -----------------------------------------------------------------
    def available(self) -> Availability:
        if not getattr(self.rec.options, self.option):
            return NOT_ASKED
        root = tp.tracefs_root()
        if root is None:
            return Availability(False, "tracefs cannot be read")
        missing = self.needs.missing_tracepoints(root) + self.needs.btf_status()["missing"]
        if missing:
            return Availability(False, f"the kernel lacks {', '.join(missing)} (run `engramprof doctor`)")
        return YES

    def load(self) -> None:
        """Compile the probe, attached by :meth:`arm`."""
        rec, s = self.rec, self.rec.selection
        self.probe = self.make_probe()
        self.decoder = self.make_decoder()
        known = {(d, i): (p, False) for d, i, p in s.files}
        paths, tensors = rec.paths, rec.tensors
        self.files = PerPid(lambda p: FilePathEnricher(p, paths, known, names=rec.kernel_file_name))
        for pid in s.pids:  # their open files now: a reader that exits before the first drain is named too
            self.files.of(pid)
        self.enrichers = [self.files, TensorEnricher(paths, tensors)]
        measured = self.measured()
        self.tables = EventTableBuilder(pa.array([self.syscall], type=pa.string()), paths, tensors,
                                        missing=[c for c in EVIDENCE_COLUMNS if c not in measured])
        missing = self.probe.plan.missing
        if missing:
            rec.notes.append(f"{self.label} evidence not collected: {', '.join(missing)}")
        rec.put_meta(**{f"{self.meta_prefix}_probe": self.probe_module.PROBE_FILE,
                        f"{self.meta_prefix}_missing": missing})

    def arm(self) -> None:
        self.decoder.window.begin(self.probe.arm())
        self.lost.checked_ns = self.probe.armed_ns

    def begin_window(self, start_ns: int) -> None:
        """Reads submitted before the window (``start_ns``) are not kept."""
        self.decoder.window.begin(start_ns)

    @property
    def partial_at_start(self) -> int:
        return self.decoder.partial_at_start if self.decoder is not None else 0

    def drain(self, sink) -> None:
        if self.probe is None or self.probe.bpf is None or not self.batching.due(self.probe.ring):
            return
        batch = self.decoder.decode(self.probe.drain())
        self.lost.check(sink, self.probe.lost_records())
        if batch is None:
            return
        for e in self.enrichers:
            e.enrich(batch)
        self.recorded += len(batch)
        sink.add_events(self.tables.build(batch))
        self.rec.files_mapped(self.files)  # a file read for the first time: watched for evictions

    def detach(self) -> None:
        if self.probe is not None:
            self.probe.detach()
        self.batching.final = True

    def sync_targets(self) -> None:
        sync_probe_targets(self.probe)

    def seen_tgids(self) -> set[int]:
        return set(self.files.by_pid) if self.files is not None else set()

    def totals(self) -> dict[str, int]:
        return ProbeTotals.totals(self)

    def close(self) -> None:
        if self.probe is not None and self.probe.bpf is not None:
            self.totals()
            self.probe.close()
