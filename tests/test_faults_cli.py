"""The page-fault read path through the CLI (real eBPF): `syscalls --json` of the lab's mmap
reader on an evicted table has the `faults` summary; `--no-fault-address` forces the generic
path (no exceptions:page_fault_user): the same major faults, no address; the summary renders
faults beside calls at 80 columns."""
from __future__ import annotations

import io

import pytest
from rich.console import Console

from engramprof import trace
from engramprof.report import syscalls as report_syscalls
from engramprof.lab import table
from tests.kernel_skips import completions_skipped
from tests.tracing import traced_lab

FAULT_KEYS = {"faults", "major", "minor", "retried", "lost_records", "recorded", "partial_at_start", "sum_ms",
              "other_faults", "address", "missing_tracepoints", "bios_untracked", "missing", "lock_retried",
              "fault_around", "async_ra", "no_state", "code_faults", "code_major", "kernel_mode_faults"}
LAB = ("--reader", "mmap", "--cold", "--steps", "4", "--tokens", "8", "--heads", "4", "--seed", "5")


@pytest.fixture(scope="module")
def tbl(tmp_path_factory):
    p = tmp_path_factory.mktemp("faults-cli") / "engram.safetensors"
    table.make_table(p, 1 << 14, 256, (3, 17), seed=4)  # 2 x 16384 x 264 B: 8.6 MiB
    return p


def _faults(run):
    ev = trace.load(run.trace)
    return ev[(ev["kind"] == "fault") & ev["major"].fillna(False).astype(bool)]


@pytest.mark.bpf
def test_syscalls_json_has_the_faults_summary_and_no_fault_address_forces_the_generic_path(tmp_path, tbl):
    a = traced_lab(tmp_path, tbl, *LAB, name="a")
    assert a.tracer_rc == 0, a.tracer_err
    assert "and page faults" in next(l for l in a.tracer_err.splitlines() if l.startswith("Tracing"))
    f = a.summary["faults"]
    assert set(f) == FAULT_KEYS, set(f) ^ FAULT_KEYS
    assert f["major"] > 0 and f["faults"] == f["major"] + f["minor"] and f["lost_records"] == 0
    assert f["partial_at_start"] == 0  # the lab waited for SIGUSR1: no fault before the window
    assert f["address"] is True and f["other_faults"] is not None and f["sum_ms"] > 0
    # a few bios in flight at a time: every one found a free slot, unless the kernel skipped a
    # completion (its slot stays held: probes/bios.h), which the recording counts
    skipped = a.summary["kernel_skipped"]
    assert skipped["runs"] is not None, skipped  # this kernel counts skipped programs (bpf/progstats.py)
    assert f["bios_untracked"] == 0 or completions_skipped(skipped["sources"].get("faults")) > 0, skipped
    assert a.summary["calls"] == 0  # the mmap reader makes no preadv2 call: faults are its reads
    fa = _faults(a)
    assert len(fa) == f["major"] or abs(len(fa) - f["major"]) <= 0.02 * f["major"]
    assert fa["address"].notna().all()

    b = traced_lab(tmp_path, tbl, *LAB, tracer_args=("--no-fault-address",), name="b")
    assert b.tracer_rc == 0, b.tracer_err
    g = b.summary["faults"]
    assert g["address"] is False and g["other_faults"] is None and g["major"] > 0
    fb = _faults(b)
    assert fb["address"].isna().all()
    tb = str(tbl)
    assert sorted(fa.loc[fa["path"] == tb, "offset"]) == sorted(fb.loc[fb["path"] == tb, "offset"])

    buf = io.StringIO()
    report_syscalls.print_summary(Console(file=buf, width=80), b.summary)
    out = buf.getvalue()
    assert all(len(l.rstrip()) <= 80 for l in out.splitlines()), out
    line = " ".join(out.split())
    assert f"{g['major']:,} major" in line and "no fault address" in line and "page faults" in line
