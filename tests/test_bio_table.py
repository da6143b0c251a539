"""The in-flight bio table's constants (engramprof/bpf/bios.py) and how its bios_untracked total
reaches the summary and the diagnosis (no eBPF: tests/test_fault_bios.py loads the probes)."""
from __future__ import annotations

import pytest

from engramprof.analysis import diagnose
from engramprof.bpf import bios
from engramprof.report.syscalls import fault_summary_line


def test_bio_slots_must_be_a_power_of_two_and_the_stale_bound_at_least_a_tick():
    assert bios.defines(1, raw_completion=False) == {"BIO_SLOTS": 1, "BIO_STALE_NS": bios.BIO_STALE_NS,
                                                     "BIO_SECTOR_ONCE": 0, "BIO_RAW_COMPLETION": 0}
    assert bios.defines(1, sector_once=True)["BIO_SECTOR_ONCE"] == 1
    assert bios.defines(16384, 1 << 20)["BIO_SLOTS"] == 16384
    for bad in (0, 3, 6000):
        with pytest.raises(ValueError):
            bios.defines(bad)
    with pytest.raises(ValueError):
        bios.defines(1, (1 << 20) - 1)


def test_the_raw_completion_hooks_read_the_fields_of_the_running_kernel(tmp_path):
    """BIO_RAW_COMPLETION and its OFF_* offsets come from the kernel's BTF (every field, at the
    size the hook reads); a kernel without BTF, or a field missing, gives the tracepoint hooks."""
    offs = bios.completion_offsets()
    d = bios.defines()
    if offs is None:
        assert d["BIO_RAW_COMPLETION"] == 0 and not any(k.startswith("OFF_") for k in d)
        pytest.skip("no kernel BTF with the block completion fields here: the tracepoint hooks")
    assert set(offs) == set(bios.COMPLETION_FIELDS) and d["BIO_RAW_COMPLETION"] == 1
    assert {k: d[k] for k in offs} == offs
    assert bios.completion_offsets(str(tmp_path / "no-btf")) is None  # no BTF: the tracepoint hooks
    assert len({offs["OFF_DISK_MAJOR"], offs["OFF_DISK_MINOR"]}) == 2


def test_both_probes_inline_the_table():
    from engramprof.bpf import faults
    from engramprof.bpf import syscalls as syscalls_probe
    from engramprof.host.tracepoints import tracefs_root

    if tracefs_root() is None:
        pytest.skip("no tracefs: the plans feature-probe it")
    texts = [faults.program_text(faults.plan(faults.FaultProbeConfig(tgid=1, bio_slots=4))),
             syscalls_probe.program_text(syscalls_probe.plan(syscalls_probe.SyscallsConfig(tgid=1, bio_slots=4)))]
    # a fault's bios are page-cache reads (a sector read once at a time); a call's may be O_DIRECT
    assert "#define BIO_SECTOR_ONCE 1\n" in texts[0] and "#define BIO_SECTOR_ONCE 0\n" in texts[1]
    for text in texts:
        assert '#include "bios.h"' not in text
        assert "#define BIO_SLOTS 4\n" in text
        assert "BPF_ARRAY(bio_slots, struct bio_slot, BIO_SLOTS);" in text
        assert "lru_hash" not in text


def test_untracked_bios_are_a_limit_of_the_diagnosis_and_in_the_fault_line():
    summary = {"duration_s": 5.0, "end_reason": "duration", "bios_untracked": 3,
               "faults": {"faults": 10, "major": 4, "bios_untracked": 2}}
    lines = diagnose.limits({"batches": 50}, summary, 5.0, True)
    assert any(line.startswith("5 bios were counted but not timed") for line in lines), lines
    clean = diagnose.limits({"batches": 50}, {**summary, "bios_untracked": 0, "faults": {}}, 5.0, True)
    assert not any("not timed" in line for line in clean), clean
    assert "; 2 bios untracked (no bio time)" in fault_summary_line(summary["faults"])
    assert "untracked" not in fault_summary_line({"faults": 10, "major": 4})


def test_untracked_bios_get_a_summary_row_only_when_there_are_some():
    import io

    from rich.console import Console

    from engramprof.report import syscalls as report_syscalls
    from tests.test_render80 import _syscalls_summary, fits

    def render(n):
        buf = io.StringIO()
        report_syscalls.print_summary(Console(file=buf, width=80), {**_syscalls_summary("/var/tmp/t.st"),
                                                                    "bios_untracked": n})
        return buf.getvalue()

    out = render(12345)
    fits(out)
    assert "untracked bios   12,345 queued by calls" in out
    assert "untracked bios" not in render(0)


def test_every_read_path_untracked_bios_are_a_limit_and_in_its_row():
    """io_uring's and libaio's untracked bios (their probes count them like the others) are in the
    diagnosis' limit and on their summary rows; libaio reads have a row of their own."""
    import io

    from rich.console import Console

    from engramprof.report import syscalls as report_syscalls
    from engramprof.report.syscalls import libaio_summary_line, uring_summary_line
    from tests.test_render80 import _syscalls_summary, fits

    summary = {"duration_s": 5.0, "end_reason": "duration", "bios_untracked": 0,
               "uring": {"completed": 9, "submitted": 9, "bios_untracked": 4},
               "libaio": {"reaped": 7, "submitted": 7, "bios": 7, "bios_untracked": 16124}}
    lines = diagnose.limits({"batches": 50}, summary, 5.0, True)
    assert any(line.startswith("16,128 bios were counted but not timed") for line in lines), lines
    assert uring_summary_line(summary["uring"]).endswith("; 4 bios untracked (no bio time)")
    aio = libaio_summary_line({"reaped": 679_773, "submitted": 685_401, "sum_ms": 46443.4, "bios": 685_401,
                               "bios_untracked": 16_124})
    assert aio == ("679,773 read iocbs reaped of 685,401 submitted, 46,443.4 ms in flight; 685,401 bios; "
                   "16,124 bios untracked (no bio time)")
    assert "untracked" not in libaio_summary_line({"reaped": 1, "submitted": 1, "bios": 1})
    buf = io.StringIO()
    report_syscalls.print_summary(Console(file=buf, width=80), {**_syscalls_summary("/var/tmp/t.st"),
                                                                "libaio": summary["libaio"]})
    fits(buf.getvalue())
    assert "libaio reads" in buf.getvalue()
