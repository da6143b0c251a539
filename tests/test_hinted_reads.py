"""A reader that hints before it reads, nobody here wrote: pyarrow's Parquet reader.

``ParquetFile.read_row_groups`` calls ``posix_fadvise(WILLNEED)`` on the column chunks it is
about to read (from the calling thread), then ``pread64``s them on arrow's I/O threads.  The
hint inserts every page, so no read event inserts any; the reads sleep on pages still under
I/O.  Cold (the file dropped from the page cache every step), those sleeps are the miss's wait:
residency, not "unexplained" (engramprof/analysis/own_insertions.py: a batch in which the target
inserted pages of its files is a miss context).  Real eBPF, one recording.
"""
from __future__ import annotations

import json
import os
import signal
import textwrap

import pytest

from tests.tracing import PY, Proc, engramprof

pytestmark = pytest.mark.bpf

STEPS = 30

READER = textwrap.dedent(r"""
    import json, os, random, signal, sys, time
    import numpy as np, pyarrow as pa, pyarrow.parquet as pq
    from engramprof.markers import MarkerWriter
    path, markers = sys.argv[1], sys.argv[2]
    t = pa.table({f"c{i}": np.random.default_rng(i).random(1_000_000) for i in range(8)})
    pq.write_table(t, path, row_group_size=25_000, compression="none")
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    f = pq.ParquetFile(path)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    print("ready", file=sys.stderr, flush=True)
    signal.sigwait({signal.SIGUSR1})
    w, rng, rows = MarkerWriter(markers), random.Random(0), 0
    for s in range(int(sys.argv[3])):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # cold every step
        t0 = time.monotonic_ns()
        rows += f.read_row_groups(rng.sample(range(f.num_row_groups), 4), use_threads=True).num_rows
        w.write(t0, time.monotonic_ns())
        time.sleep(0.005)
    w.close()
    print(json.dumps({"rows": rows}))
""")


@pytest.fixture(scope="module")
def hinted(tmp_path_factory):
    d = tmp_path_factory.mktemp("parquet")
    path, markers, out = d / "t.parquet", d / "m.jsonl", d / "trace"
    reader = Proc([PY, "-c", READER, str(path), str(markers), str(STEPS)])
    try:
        reader.wait_line("ready", timeout=120)
        tracer = Proc(engramprof("syscalls", "--pid", reader.pid, "--output", out, "--json"))
        tracer.wait_line("Tracing", timeout=180)
        os.kill(reader.pid, signal.SIGUSR1)
        rc, rout, err = reader.finish(timeout=300)
        assert rc == 0, err
        trc, _, terr = tracer.finish(timeout=120)
        assert trc == 0, terr
    finally:
        if reader.p.poll() is None:
            reader.p.kill()
            reader.p.wait()
    assert json.loads(rout)["rows"] == STEPS * 4 * 25_000
    return path, markers, out


def test_reads_that_sleep_on_hinted_pages_are_residency_not_unexplained(hinted):
    from engramprof import trace
    from engramprof.analysis import analyse
    from engramprof.analysis.batches import read_markers

    path, markers, out = hinted
    tr = trace.load_bundle(out)
    mine = tr.calls[tr.calls["path"] == str(path)]
    assert len(mine) >= STEPS and (mine["syscall"].astype(str) == "pread64").all()
    # the premise: the hints inserted the pages, the reads none, and the reads slept for a part
    # of the steps' time (2-8% in runs here: how much of its I/O the hint has done by the time
    # the reads come depends on the disk)
    assert int(mine["pages_added"].sum()) == 0, mine["pages_added"].sum()
    mdf, _ = read_markers(markers)
    slept = float((mine["offcpu_ns"] - mine["runq_ns"]).clip(lower=0).sum())
    sleep_share = slept / float((mdf["end_ns"] - mdf["start_ns"]).sum())
    assert sleep_share > 0.01, sleep_share
    pc = tr.samples("pagecache")
    ins = pc[(pc["event"] == "insert") & pc["target"].astype(bool) & (pc["path"] == str(path))]
    assert ins["in_hint"].astype(bool).any() and int(ins["pages"].sum()) > 0
    summary = analyse(tr, mdf).summary
    share = summary["share"]
    assert share["unexplained"] < 0.05 and share["residency"] > 0.05, share
    # without the page-cache samples the same sleeps had no miss to belong to: about their share
    # of the steps' time moves from residency to unexplained (CI run 34 asked for more than 5%
    # of it, and failed where the sleeps were 2-4%)
    blind = analyse(tr, mdf, samples={"pagecache": None}).summary["share"]
    assert blind["unexplained"] >= share["unexplained"] + 0.5 * sleep_share, (blind, share, sleep_share)
    assert blind["residency"] < share["residency"], (blind, share)
    # the hint calls' own time (pages allocated, bios queued on the calling thread, no read in
    # flight) is residency too: without the hint samples it was the thread's own work
    hints = tr.samples("pagecache_hints")
    assert ((hints["advice"] == "WILLNEED") & (hints["path"] == str(path)) & (hints["dur_ns"] > 0)).any()
    hinted = summary["evidence"]["hint_call_share"]
    assert hinted > 0.01, summary["evidence"]
    unhinted = analyse(tr, mdf, samples={"pagecache_hints": None}).summary
    assert "hint_call_share" not in unhinted["evidence"]
    assert share["residency"] - unhinted["share"]["residency"] == pytest.approx(hinted, rel=1e-6)
    assert sum(share.values()) == pytest.approx(sum(unhinted["share"].values()), rel=1e-9)
