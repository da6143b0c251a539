"""The probes compiled with their attach deferred, and the read-path probes built on them.

:class:`DeferredProbe`: compiled with ``deferred_bpf`` (engramprof/bpf/sched.py), attached at
once by :meth:`DeferredProbe.arm`, which says when.  :class:`RequestProbe`: a read-path probe
(io_uring, libaio: engramprof/bpf/uring.py, libaio.py) with its record and totals structs
checked against what clang compiled and one ring of records.
"""
from __future__ import annotations

import os
import time

from engramprof.bpf import structs as layout
from engramprof.bpf import targets
from engramprof.bpf.base import LoadedBpf, compile_program, import_bcc
from engramprof.bpf.ringbuf import RingBufferReader
from engramprof.bpf.sched import attach_all, deferred_bpf
from engramprof.errors import UserError


class DeferredProbe(LoadedBpf):
    """A probe compiled with its attach deferred (engramprof/bpf/sched.py's ``deferred_bpf``):
    :meth:`arm` attaches every program at once and says when.  ``what`` names it in errors."""

    what: str = "probe"
    armed_ns: int | None = None

    def arm(self) -> int:
        """Attach the programs; returns when they were attached (CLOCK_MONOTONIC ns).  A read
        begun before that instant is never recorded (it is not in the in-flight map)."""
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
        self.prepare()
        if arm:
            self.arm()

    def prepare(self) -> None:
        """What a probe sets up between its compile and its attach (nothing by default)."""

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
