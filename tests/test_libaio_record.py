"""libaio reads in a recording (issue 22): `engramprof syscalls --pid` on the lab's aio reader
(`lab run --reader aio`: io_submit of one IOCB_CMD_PREAD per row on an O_DIRECT fd, every event
reaped with io_getevents each step).  Real eBPF, small: a 34 MiB table, a few dozen steps.

Every row the reader read is one read event of kind ``libaio`` (the reader's own marker log
counts them), on the table's path (named from the (dev, ino) the kernel took at submit), with its
tensor and row, O_DIRECT, its file identity in ``dev`` / ``ino``.
"""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from rich.console import Console

from engramprof import trace
from engramprof.lab import table
from engramprof.report import syscalls as report_syscalls
from tests.tracing import traced_lab

pytestmark = pytest.mark.bpf

ROWS, DIM, STEPS = 32768, 256, 30


@pytest.fixture(scope="module")
def tbl(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("libaio-record") / "engram.safetensors"
    table.make_table(path, ROWS, DIM, (3, 17), seed=7)
    return path


def test_every_row_read_through_aio_is_one_libaio_read_event(tbl, tmp_path):
    m = tmp_path / "m.jsonl"
    run = traced_lab(tmp_path, tbl, "--reader", "aio", "--steps", str(STEPS), "--cold", "--markers", str(m))
    assert run.tracer_rc == 0, run.tracer_err
    assert any(l.startswith("Tracing") and "libaio reads" in l for l in run.tracer_err.splitlines())
    calls = trace.load_bundle(run.trace).calls
    ev = calls[calls["kind"].astype(str) == "libaio"]
    rows = run.lab["rows"]
    assert rows == sum(json.loads(x)["rows"] for x in m.read_text().splitlines())
    assert len(ev) == rows, (len(ev), rows)
    assert set(ev["path"]) == {str(tbl)}
    st = os.stat(tbl)
    assert (ev["dev"] == st.st_dev).all() and (ev["ino"] == st.st_ino).all()
    assert (ev["tensor"] != "").all() and (ev["row"] >= 0).all()
    # O_DIRECT reads are block-aligned: the last one of the file ends short, at its end
    assert (ev["ret"] == ev["size"].clip(upper=st.st_size - ev["offset"])).all()
    assert (ev["syscall"] == "io_submit").all()
    assert ev["direct"].astype(bool).all()
    # the device's part: each O_DIRECT iocb's bio (several per io_submit: named by iomap_dio_rw_begin by
    # file and offset; a row read twice in one step is two iocbs of one offset: the bios go to one)
    per_offset = ev.groupby(["ts_ns", "offset"])["bio_count"].sum()
    assert (per_offset >= 1).all() and (ev["bio_ns"] <= ev["dur_ns"]).all()
    s = run.summary["libaio"]
    assert s["recorded"] == rows and s["reaped"] == rows and s["lost_records"] == 0, s
    assert s["submit_failed"] == 0 and s["other_iocbs"] == 0 and s["destroyed_inflight"] == 0, s
    # the printed summary does not say the reader read nothing (it made no preadv call, no major fault)
    buf = io.StringIO()
    report_syscalls.print_summary(Console(file=buf, width=80), run.summary)
    assert run.summary["calls"] == 0 and "made no preadv2/preadv/pread64" not in " ".join(buf.getvalue().split())
