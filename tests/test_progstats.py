"""Runs of the probes' programs the kernel skipped (engramprof/bpf/progstats.py): reading
bpf_prog_info.recursion_misses, naming hooks, the recording's count, and where it is said (the
syscalls summary, diagnose's limits, batch-tail's notes).  The real skips are made in
tests/test_fault_bios.py (tests/kernel_skips.py); this kernel counting them at all is checked
by tests/test_faults_cli.py."""
from __future__ import annotations

import ctypes
import io
import sys

import pytest
from rich.console import Console

from engramprof.analysis import diagnose
from engramprof.analysis.holes import skipped_runs_notes
from engramprof.bpf import progstats
from engramprof.report import syscalls as report_syscalls
from tests.test_render80 import _syscalls_summary, fits


def fake_get_info(misses_by_fd: dict[int, int | None], written: int = progstats.INFO_LEN):
    """bpf_obj_get_info over fds: the kernel writes ``written`` bytes of the struct (its size);
    an fd mapped to None fails."""
    def get_info(fd, buf, n):
        v = misses_by_fd.get(fd)
        if v is None:
            return -1
        ctypes.memmove(ctypes.addressof(buf) + progstats.RECURSION_MISSES_OFFSET,
                       v.to_bytes(8, sys.byteorder), 8)
        n._obj.value = min(n._obj.value, written)
        return 0
    return get_info


class FakeFn:
    def __init__(self, fd):
        self.fd = fd


class FakeBpf:
    def __init__(self, funcs):
        self.funcs = {name: FakeFn(fd) for name, fd in funcs.items()}


@pytest.mark.parametrize("name, hook", [
    (b"tracepoint__block__block_rq_complete", "block:block_rq_complete"),
    ("tracepoint__sched__sched_wakeup", "sched:sched_wakeup"),
    (b"raw_tracepoint__sched_switch", "raw:sched_switch"),
    ("tracepoint__syscalls__sys_exit_pread64", "syscalls:sys_exit_pread64"),
    ("on_fault", "on_fault"),
])
def test_hook_names(name, hook):
    assert progstats.hook_name(name) == hook


@pytest.mark.parametrize("misses, written, expect", [
    (7, progstats.INFO_LEN, 7),
    (0, progstats.INFO_LEN, 0),
    (7, progstats.RECURSION_MISSES_OFFSET, None),  # a kernel whose struct ends before the field
    (None, progstats.INFO_LEN, None),  # the call failed (fd gone)
])
def test_recursion_misses_read_from_the_struct_or_none(misses, written, expect):
    assert progstats.recursion_misses(3, fake_get_info({3: misses}, written)) == expect


def test_skipped_runs_per_hook_only_the_skipped_and_none_when_not_counted():
    bpf = FakeBpf({b"tracepoint__block__block_rq_complete": 3, b"tracepoint__sched__sched_switch": 4,
                   b"tracepoint__sched__sched_wakeup": 5})
    got = progstats.skipped_runs(bpf, fake_get_info({3: 2, 4: 0, 5: 9}))
    assert got == {"block:block_rq_complete": 2, "sched:sched_wakeup": 9}
    assert progstats.skipped_runs(bpf, fake_get_info({3: 0, 4: 0, 5: 0})) == {}
    assert progstats.skipped_runs(bpf, fake_get_info({}, progstats.INFO_LEN)) is None
    assert progstats.skipped_runs(FakeBpf({}), fake_get_info({})) is None


def test_the_recording_count_sums_sources_and_says_when_nothing_was_counted():
    s = progstats.summarize({"faults": {"block:block_rq_complete": 2}, "sched": {"sched:sched_wakeup": 1},
                             "syscalls": {}, "samples": None})
    assert s == {"runs": 3, "sources": {"faults": {"block:block_rq_complete": 2}, "sched": {"sched:sched_wakeup": 1}}}
    assert progstats.summarize({"syscalls": {}}) == {"runs": 0, "sources": {}}
    assert progstats.summarize({"samples": None}) == {"runs": None, "sources": {}}


def test_the_hooks_line_puts_the_most_skipped_first_and_counts_the_rest():
    s = progstats.summarize({"faults": {"block:block_rq_complete": 2, "a:b": 1, "c:d": 1},
                             "sched": {"sched:sched_wakeup": 5}})
    assert progstats.hooks_line(s) == "sched:sched_wakeup 5 (sched), block:block_rq_complete 2 (faults), a:b 1 (faults), 1 more"
    assert progstats.hooks_line(None) == ""
    assert progstats.sentence({"runs": 0, "sources": {}}) is None
    assert progstats.sentence({"runs": None, "sources": {}}) is None
    assert progstats.sentence(None) is None


SKIPPED = {"runs": 3, "sources": {"faults": {"block:block_rq_complete": 2}, "sched": {"sched:sched_wakeup": 1}}}


def test_skipped_runs_are_said_in_the_summary_the_limits_and_the_notes():
    buf = io.StringIO()
    report_syscalls.print_summary(Console(file=buf, width=80), {**_syscalls_summary("/var/tmp/t.st"),
                                                                "kernel_skipped": SKIPPED})
    out = buf.getvalue()
    fits(out)
    flat = " ".join(out.split())
    assert "skipped runs The kernel skipped 3 runs of the probes' programs" in flat, out
    assert "block:block_rq_complete 2 (faults)" in flat
    buf = io.StringIO()
    report_syscalls.print_summary(Console(file=buf, width=80), {**_syscalls_summary("/var/tmp/t.st"),
                                                                "kernel_skipped": {"runs": 0, "sources": {}}})
    assert "skipped runs" not in buf.getvalue()

    summary = {"duration_s": 5.0, "end_reason": "duration", "kernel_skipped": SKIPPED}
    lines = diagnose.limits({"batches": 50}, summary, 5.0, True)
    assert any(line.startswith("the kernel skipped 3 runs") and "sched:sched_wakeup 1 (sched)" in line
               for line in lines), lines
    assert not any("skipped" in line for line in diagnose.limits({"batches": 50}, {**summary, "kernel_skipped": None},
                                                                 5.0, True))

    assert skipped_runs_notes({"kernel_skipped": SKIPPED})[0].endswith("(when is not known: no batch was left out)")
    assert skipped_runs_notes({}) == [] and skipped_runs_notes({"kernel_skipped": "garbage"}) == []
