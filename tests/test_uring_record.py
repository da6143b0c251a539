"""io_uring read requests in a recording (issue 22): `engramprof syscalls --pid` on the lab's
io_uring reader (`lab run --reader uring`: one persistent ring, a READV per row, every
completion waited for each step).  Real eBPF, small: a 34 MiB table, a few dozen steps.

- every row the reader read is one read event of kind ``io_uring``, on the table's path (named
  from the (dev, ino) the kernel took at the read), with its tensor and row;
- cold (the table dropped from the page cache every 20 ms by a thread of this process, as the
  lab's ``residency`` scenario does): the step thread's sleep in io_uring_enter is an I/O wait,
  so the verdict is ``residency``, never ``python-scheduling``; warm: ``healthy``.
"""
from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from engramprof import trace
from engramprof.analysis import diagnose
from engramprof.analysis.diagnose import read_path_of
from engramprof.lab import table
from tests.tracing import cold_verdict_ok, engramprof, traced_lab

pytestmark = pytest.mark.bpf

ROWS, DIM, STEPS = 32768, 256, 30


@pytest.fixture(scope="module")
def tbl(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("uring-record") / "engram.safetensors"
    table.make_table(path, ROWS, DIM, (3, 17), seed=7)
    return path


class Evictor:
    """POSIX_FADV_DONTNEED on the table every ``every_s`` from a thread of this process."""

    def __init__(self, path: Path, every_s: float = 0.02):
        self.path, self.every_s = path, every_s
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        fd = os.open(self.path, os.O_RDONLY)
        try:
            while not self.stop.wait(self.every_s):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join(5)


def _batch_tail(run, markers: Path) -> dict:
    p = subprocess.run(engramprof("batch-tail", run.trace, "--markers", markers, "--json"), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_every_row_read_through_the_ring_is_one_io_uring_read_event(tbl, tmp_path):
    m = tmp_path / "m.jsonl"
    run = traced_lab(tmp_path, tbl, "--reader", "uring", "--steps", str(STEPS), "--cold", "--markers", str(m))
    assert run.tracer_rc == 0, run.tracer_err
    assert any(l.startswith("Tracing") and "io_uring reads" in l for l in run.tracer_err.splitlines())
    calls = trace.load_bundle(run.trace).calls
    ur = calls[calls["kind"].astype(str) == "io_uring"]
    rows = run.lab["rows"]
    assert rows == sum(json.loads(x)["rows"] for x in m.read_text().splitlines())
    assert len(ur) == rows, (len(ur), rows)
    assert set(ur["path"]) == {str(tbl)}
    assert (ur["tensor"] != "").all() and (ur["row"] >= 0).all()
    assert (ur["ret"] == ur["size"]).all() and (ur["syscall"] == "io_uring").all()
    assert set(ur["uring_path"]) <= {"inline", "async", "punted"} and not ur["direct"].astype(bool).any()
    s = run.summary["uring"]
    assert s["recorded"] == rows and s["completed"] == rows and s["lost_records"] == 0
    # the table's pages came in: cold requests were served async (waited on the page), not inline
    assert (ur["uring_path"] != "inline").any()
    # each request's insertions and bios, in the thread issuing it: the cold table's pages were
    # inserted by the requests (readahead windows: some requests insert many, later ones none)
    # and their bios timed within the request (bio time never longer than submit -> complete)
    assert ur["pages_added"].sum() >= len(tbl.read_bytes()) // 4096 // 4, ur["pages_added"].sum()
    assert ur["bio_count"].sum() > 0 and (ur["bio_ns"] <= ur["dur_ns"]).all()
    assert ((ur["bio_ns"] > 0) <= (ur["bio_count"] > 0)).all()  # bio time only where bios were queued
    assert ur["offcpu_ns"].isna().all() and ur["reclaim_ns"].isna().all()  # not per request: null


@pytest.mark.parametrize("cache", ["cold", "warm"])
def test_io_uring_wait_is_io_not_python_scheduling(tbl, tmp_path, cache):
    m = tmp_path / "m.jsonl"
    args = ("--reader", "uring", "--steps", str(STEPS), "--gap-ms", "5", f"--{cache}", "--markers", str(m))
    if cache == "cold":
        with Evictor(tbl):
            run = traced_lab(tmp_path, tbl, *args)
    else:
        run = traced_lab(tmp_path, tbl, *args)
    assert run.tracer_rc == 0, run.tracer_err
    bt = _batch_tail(run, m)
    assert bt["read_events"].get("io_uring") == run.lab["rows"]
    assert read_path_of(bt) == "io_uring"
    share = bt["share"]
    # the paths it took: buffered io_uring requests; each step's rows submitted together and
    # waited for (queue depth > 1, at most the step's rows); the split is the trace's own
    ur = trace.load_bundle(run.trace).calls
    ur = ur[ur["kind"].astype(str) == "io_uring"]
    assert [(p["kind"], p["direct"], p["events"]) for p in bt["read_paths"]] == [("io_uring", False, len(ur))]
    u = bt["io_uring"]
    assert u["paths"] == {p: int((ur["uring_path"] == p).sum()) for p in ("inline", "async", "punted")}
    per_step = run.lab["rows"] // STEPS
    assert 1 < u["queue_depth_max"]["p50"] <= per_step, u["queue_depth_max"]
    assert u["submit_complete_ms"]["p50"] == pytest.approx(ur["dur_ns"].median() / 1e6)
    assert bt["missing_evidence"] == [], bt["missing_evidence"]
    if cache == "cold":
        assert bt["verdict"] != "python-scheduling", (bt["verdict"], share)
        # (storage only where its bios show the device slow: tests/tracing.py)
        assert cold_verdict_ok(bt["verdict"], trace.load_bundle(run.trace).calls), (bt["verdict"], share)
        assert share["python-scheduling"] < 0.1, share
        assert share["unexplained"] < 0.1, share
        # diagnose on the same bundle: the paths and how io_uring served them, in the evidence
        d = diagnose.analyse_trace(str(run.trace), str(m), 4.0, run.summary, 5.0)
        steps = {e["step"]: e["finding"] for e in d["evidence"]}
        assert d["verdict"] == bt["verdict"] and d["read_path"] == "io_uring"
        assert steps["read paths"].startswith("io_uring (buffered)") and "async" in steps["io_uring"], steps
    else:
        assert bt["verdict"] == "healthy", (bt["verdict"], share)
        # warm: almost no request inserted a page or queued a bio (a page the host's memory
        # pressure evicted meanwhile comes back: at most 1% of the requests)
        calls = trace.load_bundle(run.trace).calls
        ur = calls[calls["kind"].astype(str) == "io_uring"]
        assert ((ur["pages_added"] > 0) | (ur["bio_count"] > 0)).mean() <= 0.01, ur[["pages_added", "bio_count"]].sum()
