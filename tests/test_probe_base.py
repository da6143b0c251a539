"""engramprof/bpf/base.py: what every loaded probe shares (totals over CPUs, the lost count,
detach order, close, the compile error), checked on a stand-in for BCC's object: no root."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from engramprof.bpf.base import LoadedBpf, compile_program
from engramprof.errors import UserError


class Totals(ctypes.Structure):
    _fields_ = [("calls", ctypes.c_uint64), ("lost_records", ctypes.c_uint64), ("max_ns", ctypes.c_uint64)]


class FakeBpf:
    """BCC's BPF as the base class uses it: maps by name, attached programs, detach, cleanup."""

    def __init__(self, per_cpu):
        self.maps = {"t_totals": [per_cpu]}
        self.tracepoint_fds = {"syscalls:sys_enter_x": 3, "sched:sched_switch": 4}
        self.raw_tracepoint_fds = {b"sys_enter": 5}
        self.detached: list[str] = []
        self.cleaned = False

    def __getitem__(self, name):
        return self.maps[name]

    def detach_tracepoint(self, n):
        self.detached.append(n)

    def detach_raw_tracepoint(self, n):
        self.detached.append(("raw", n))

    def cleanup(self):
        self.cleaned = True


class FakeRing:
    closed = False

    def close(self):
        self.closed = True


def _probe(cls, per_cpu):
    p = cls()
    p.bpf = FakeBpf(per_cpu)
    p.ring = FakeRing()
    p.totals_dtype = np.dtype([(f, np.uint64) for f, _ in Totals._fields_])
    return p


class SumProbe(LoadedBpf):
    totals_map = "t_totals"


class MaxProbe(LoadedBpf):
    totals_map = "t_totals"
    max_fields = ("max_ns",)


CPUS = [Totals(10, 1, 700), Totals(5, 2, 900), Totals(0, 0, 100)]


def test_totals_sum_over_cpus_but_a_max_field_is_the_largest_cpu():
    assert _probe(SumProbe, CPUS).totals() == {"calls": 15, "lost_records": 3, "max_ns": 1700}
    assert _probe(MaxProbe, CPUS).totals() == {"calls": 15, "lost_records": 3, "max_ns": 900}


def test_lost_records_reads_the_named_field():
    assert _probe(SumProbe, CPUS).lost_records() == 3

    class OtherField(SumProbe):
        lost_field = "calls"

    assert _probe(OtherField, CPUS).lost_records() == 15


def test_detach_takes_raw_tracepoints_first_then_returns_when_done_and_close_is_once():
    import time

    p = _probe(SumProbe, CPUS)
    before = time.monotonic_ns()
    ended = p.detach()
    assert ended >= before
    assert p.bpf.detached == [("raw", b"sys_enter"), "syscalls:sys_enter_x", "sched:sched_switch"]
    bpf, ring = p.bpf, p.ring
    p.close()
    assert bpf.cleaned and ring.closed and p.bpf is None
    p.close()  # closed already: nothing
    assert p.detach() is None


def test_a_compile_failure_is_one_line_naming_the_probe_and_the_hint():
    def broken(**_kw):
        raise Exception("clang: error: bad thing")

    with pytest.raises(UserError) as e:
        compile_program(broken, "int x;", "sched (off-CPU) probe", hint=", or record without it: --no-offcpu")
    msg = str(e.value)
    assert msg == ("cannot load the sched (off-CPU) probe (clang: error: bad thing); run `engramprof doctor`, "
                   "or record without it: --no-offcpu")
    assert e.value.code == 1 and "\n" not in msg


def test_compile_passes_the_text_and_the_common_flags():
    seen = {}

    def fake(**kw):
        seen.update(kw)
        return "compiled"

    assert compile_program(fake, "int y;", "export probe") == "compiled"
    assert seen == {"text": b"int y;", "cflags": ["-Wno-macro-redefined", "-Wno-unused-function"]}


@pytest.mark.parametrize("mod,cls,totals_map", [
    ("engramprof.bpf.syscalls", "SyscallsProbe", "call_totals"),
    ("engramprof.bpf.evictions", "LoadedEvictionProbe", "eviction_totals"),
    ("engramprof.bpf.faults", "LoadedFaultProbe", "fault_totals"),
    ("engramprof.bpf.sched", "LoadedSchedProbe", "offcpu_totals"),
    ("engramprof.bpf.pagecache", "LoadedPagecacheProbe", "pagecache_totals"),
    ("engramprof.export.probe", "ExportProbe", "export_totals"),
])
def test_every_loader_names_a_totals_map_its_probe_defines(mod, cls, totals_map):
    import importlib
    import re

    from engramprof.bpf import structs as layout

    m = importlib.import_module(mod)
    k = getattr(m, cls)
    assert issubclass(k, LoadedBpf) and k.totals_map == totals_map
    src = (layout.probe_dir() / m.PROBE_FILE).read_text()
    assert re.search(r"BPF_PERCPU_ARRAY\(%s,\s*struct (\w+)" % totals_map, src), (m.PROBE_FILE, totals_map)
    struct = re.search(r"BPF_PERCPU_ARRAY\(%s,\s*struct (\w+)" % totals_map, src).group(1)
    body = re.search(r"struct %s \{(.*?)\};" % struct, src + layout.header_text(), flags=re.S).group(1)
    fields = re.findall(r"\b(\w+);", body)
    assert k.lost_field in fields and set(k.max_fields) <= set(fields), (cls, fields)
