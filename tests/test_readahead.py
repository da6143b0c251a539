"""Readahead amplification (engramprof/analysis/readahead.py) and the page-cache probe.

Without root: the maths on hand-made insertion runs and read events.  With real eBPF: one
traced child gathers the same random rows through two memory maps of two cold copies of a
table, one with MADV_RANDOM and one without (the lab's mmap reader, ``lab run`` with and
without ``--no-random``): the amplification is ~1x and > 4x, and the pages the trace says were
inserted match what cachestat(2) shows cached afterwards (both files were evicted first); then
the child unmaps and drops the second file, and the read-ahead pages no read had touched are
counted wasted from the eviction probe's records.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

from engramprof.analysis import readahead
from engramprof.analysis.readahead import PAGE, PagecacheInputs
from tests.synthetic import fs_type
from tests.tracing import PY, Proc, engramprof


def _calls(rows):
    """Read events: (ts_ns, dur_ns, tid, path, offset, size, kind)."""
    df = pd.DataFrame(rows, columns=["ts_ns", "dur_ns", "tid", "path", "offset", "size", "kind"])
    df["pid"] = 1
    for c in ("pages_added", "offcpu_ns", "runq_ns", "bio_count"):
        df[c] = 0
    df["ret"] = df["size"]
    df["major"] = False
    df["mapped_pages"] = 0
    return df


def _runs(rows, target=True, in_hint=False):
    """Insertion runs: (ts_ns, tid, path, first_page, pages)."""
    df = pd.DataFrame(rows, columns=["ts_ns", "tid", "path", "first_page", "pages"])
    df["event"] = "insert"
    df["target"] = target
    df["in_hint"] = in_hint
    return df


def test_a_cold_row_read_without_readahead_counts_one():
    # three 256-byte rows, each from a cold page: each read inserts its own page only
    calls = _calls([(100, 50, 7, "/t", 10 * PAGE + 256, 256, "syscall"),
                    (200, 50, 7, "/t", 20 * PAGE, 256, "syscall"),
                    (300, 50, 7, "/t", 30 * PAGE + 512, 256, "fault")])
    runs = _runs([(110, 7, "/t", 10, 1), (210, 7, "/t", 20, 1), (310, 7, "/t", 30, 1)])
    (e,) = readahead.per_file(PagecacheInputs(calls, runs, None, None, False))
    assert e["amplification"] == 1.0 and e["inserted_pages"] == 3 and e["touched_pages"] == 3
    assert e["requested_bytes"] == 768 and e["inserted_bytes"] == 3 * PAGE
    assert e["wasted_pages"] is None and not e["flagged"]  # evictions not recorded: waste unknown


def test_readahead_window_is_amplification_and_unused_pages_are_flagged():
    # two reads, each bringing a 32-page window; later reads touch 2 of the 62 read-ahead pages
    calls = _calls([(100, 50, 7, "/t", 64 * PAGE, 256, "fault"),
                    (200, 50, 7, "/t", 512 * PAGE, 256, "fault"),
                    (300, 5, 7, "/t", 65 * PAGE, 256, "fault"),
                    (400, 5, 7, "/t", 513 * PAGE, 256, "fault")])
    runs = _runs([(110, 7, "/t", 64, 32), (210, 7, "/t", 512, 32)])
    (e,) = readahead.per_file(PagecacheInputs(calls, runs, None, None, False))
    assert e["missing_reads"] == 2 and e["touched_pages"] == 2 and e["inserted_pages"] == 64
    assert e["amplification"] == 32.0 and e["readahead_pages"] == 62 and e["used_pages"] == 4
    assert e["flagged"] and "32x" in readahead.finding([e])


def test_a_sequential_reader_that_uses_its_readahead_is_not_flagged():
    # one read brings 32 pages, the next 31 reads (one a page) use them
    rows = [(100, 50, 7, "/t", 0, PAGE, "syscall")] + [(200 + 10 * i, 5, 7, "/t", i * PAGE, PAGE, "syscall")
                                                       for i in range(1, 32)]
    (e,) = readahead.per_file(PagecacheInputs(_calls(rows), _runs([(110, 7, "/t", 0, 32)]), None, None, False))
    assert e["amplification"] == 32.0 and e["used_pages"] == 32 and not e["flagged"]


def test_insertions_outside_a_read_or_by_another_thread_or_inside_a_hint_are_not_the_reads():
    calls = _calls([(100, 50, 7, "/t", 0, 256, "syscall")])
    pc = pd.concat([_runs([(110, 7, "/t", 0, 1)]),
                    _runs([(120, 8, "/t", 100, 50)]),  # another thread, while the read was in flight
                    _runs([(500, 7, "/t", 200, 50)]),  # the same thread after the read returned
                    _runs([(130, 7, "/t", 300, 50)], in_hint=True),  # a WILLNEED inside the read's window
                    _runs([(111, 7, "/t", 400, 50)], target=False)], ignore_index=True)
    (e,) = readahead.per_file(PagecacheInputs(calls, pc, None, None, False))
    assert e["inserted_pages"] == 1 and e["amplification"] == 1.0


def test_waste_is_read_ahead_pages_evicted_before_any_read_touched_them():
    calls = _calls([(100, 50, 7, "/t", 0, 256, "fault"), (900, 5, 7, "/t", 3 * PAGE, 256, "fault")])
    runs = _runs([(110, 7, "/t", 0, 8)])
    ev = pd.DataFrame({"ts_ns": [500, 500, 1000], "path": ["/t"] * 3, "index": [1, 3, 5], "pages": [2, 1, 1]})
    # pages 1, 2 evicted at 500 unread: waste; page 3 evicted at 500, read at 900 (re-inserted by
    # then, but after its eviction): waste too; page 5 evicted at 1000 unread: waste; 4, 6, 7 unread, not evicted
    (e,) = readahead.per_file(PagecacheInputs(calls, runs, None, ev, True))
    assert e["wasted_pages"] == 4
    (e,) = readahead.per_file(PagecacheInputs(calls, runs, None, ev.iloc[:0], True))
    assert e["wasted_pages"] == 0


def test_no_page_cache_samples_is_said():
    inp = PagecacheInputs(_calls([]), None, None, None, False)
    assert readahead.per_file(inp) == [] and "not recorded" in readahead.note(inp)


# --------------------------------------------------------------------- real eBPF

CHILD = textwrap.dedent("""
    import json, os, signal, sys
    import numpy as np
    from engramprof.lab import readers
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    rows = np.array(json.loads(sys.argv[3]), dtype=np.int64)
    fds = [os.open(p, os.O_RDONLY) for p in sys.argv[1:3]]
    maps = [readers._Mapping(fd, random=(i == 0)) for i, fd in enumerate(fds)]  # 1st MADV_RANDOM, 2nd not
    for fd in fds:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    print("ready", file=sys.stderr, flush=True)
    signal.sigwait({signal.SIGUSR1})
    total = 0
    for m in maps:  # the same fancy-index gather of 256-byte rows from each
        view = m.mm[: (m.size // 256) * 256].reshape(-1, 256)
        for k in range(0, len(rows), 64):
            total += int(view[rows[k:k + 64]].sum())
    from engramprof.host.cachestat import cachestat
    cached = [cachestat(fd).nr_cache for fd in fds]
    # then unmap and drop the read-ahead file: every page goes, the read-ahead pages no read
    # had touched among them (the waste)
    del view
    maps[1].close()
    os.posix_fadvise(fds[1], 0, 0, os.POSIX_FADV_DONTNEED)
    print(json.dumps({"sum": total, "cached": cached, "after_drop": cachestat(fds[1]).nr_cache}))
""")


@pytest.fixture(scope="module")
def two_tables(tmp_path_factory):
    d = tmp_path_factory.mktemp("ra")
    if fs_type(d) in ("tmpfs", "ramfs"):
        pytest.skip("tmp is on tmpfs: no droppable page cache to read ahead into")
    data = np.random.default_rng(3).integers(0, 256, size=24 << 20, dtype=np.uint8).tobytes()
    paths = []
    for name in ("random.bin", "readahead.bin"):
        p = d / name
        p.write_bytes(data)
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)  # dirty pages are not dropped by POSIX_FADV_DONTNEED
        os.close(fd)
        paths.append(p)
    return d, paths


@pytest.mark.bpf
@pytest.mark.slow  # a traced child: the probes' compile takes most of it (seconds on a busy host)
def test_readahead_on_and_off_with_the_mmap_reader_on_the_same_rows(two_tables):
    from engramprof.analysis import prefetch

    d, (rand, ahead) = two_tables
    rows = np.random.default_rng(5).choice((24 << 20) // 256, size=1500, replace=False).tolist()

    child = Proc([PY, "-c", CHILD, str(rand), str(ahead), json.dumps(rows)])
    out = d / "trace"
    try:
        child.wait_line("ready")
        tracer = Proc(engramprof("syscalls", "--pid", child.pid, "--output", out, "--json", "--no-offcpu"))
        tracer.wait_line("Tracing", timeout=180)
        os.kill(child.pid, signal.SIGUSR1)
        rc, child_out, err = child.finish()
        assert rc == 0, err
        trc, _, terr = tracer.finish()
        assert trc == 0, terr
    finally:
        if child.p.poll() is None:
            child.p.kill()
    counts = json.loads(child_out)
    cached = dict(zip((str(rand), str(ahead)), counts["cached"]))  # cachestat, right after the gathers
    keys = prefetch.json_keys(out)
    by_path = {e["path"]: e for e in keys["readahead"]}
    off, on = by_path[str(rand)], by_path[str(ahead)]
    assert off["amplification"] <= 1.5, off
    assert on["amplification"] > 4 and on["flagged"], on
    assert on["readahead_events"]["ra_order"] + on["readahead_events"]["sync_ra"] >= 1, on
    # the pages the trace saw inserted, every thread: what cachestat shows cached now (10%)
    pc = pd.read_parquet(out / "samples" / "pagecache")
    for p in (rand, ahead):
        seen = int(pc.loc[(pc["event"] == "insert") & (pc["path"] == str(p)), "pages"].sum())
        assert abs(seen - cached[str(p)]) <= 0.1 * cached[str(p)], (p, seen, cached[str(p)])
    # and the pages owned by the gather's faults are nearly all of them
    assert on["inserted_pages"] >= 0.9 * cached[str(ahead)]
    # waste: the drop removed every page (cachestat); of the read-ahead pages, those no read had
    # touched are wasted -- the eviction probe's records of them (samples/evictions) say so
    dropped = cached[str(ahead)] - counts["after_drop"]
    if keys["pagecache_note"] and "evictions were not recorded" in keys["pagecache_note"]:
        pytest.fail(f"the eviction probe did not run: {keys['pagecache_note']}")
    assert dropped >= 0.95 * cached[str(ahead)], (dropped, cached)
    ahead_used = on["used_pages"] - (on["inserted_pages"] - on["readahead_pages"])
    assert on["wasted_pages"] > 0.5 * on["readahead_pages"], on
    assert abs(on["wasted_pages"] - (on["readahead_pages"] - ahead_used)) <= 0.05 * on["readahead_pages"], on
    assert off["wasted_pages"] == 0


def test_diagnose_flags_amplification_above_4x_and_leads_the_fix_with_turning_readahead_off():
    from engramprof.analysis import diagnose

    e = {"path": "/d/t.bin", "amplification": 1228.0, "inserted_pages": 6140, "touched_pages": 5,
         "used_pages": 379, "flagged": True}
    bt = {"readahead": [e], "prefetch": {"hints": 0}}
    (step,) = diagnose.pagecache_steps(bt)
    assert step["step"] == "readahead" and "1228x on t.bin" in step["finding"] and step["value"] == {"/d/t.bin": 1228.0}
    rec = {"fix": "Keep the hot rows resident.", "confirm": "c"}
    fixed = diagnose.readahead_fix("residency", rec, bt)["fix"]
    assert fixed.startswith("Turn readahead off for t.bin: posix_fadvise(") and "read_ahead_kb" in fixed
    assert fixed.endswith("Keep the hot rows resident.")
    assert diagnose.readahead_fix("python-scheduling", rec, bt) == rec  # not about misses: left alone
    # the switch fits the reader: a mapping's faults -> MADV_RANDOM; an LMDB file -> MDB_NORDAHEAD
    mapped = {**bt, "readahead": [{**e, "read_kind": "fault"}]}
    assert "MADV_RANDOM" in diagnose.readahead_fix("residency", rec, mapped)["fix"]
    lmdb = {**bt, "readahead": [{**e, "path": "/srv/db/data.mdb", "read_kind": "fault"}]}
    fix = diagnose.readahead_fix("storage", rec, lmdb)["fix"]
    assert "MDB_NORDAHEAD" in fix and "readahead=False" in fix and "MADV_RANDOM" not in fix, fix
    quiet = {"readahead": [{**e, "amplification": 3.9, "flagged": False}], "prefetch": {"hints": 0}}
    assert diagnose.pagecache_steps(quiet) == [] and diagnose.readahead_fix("residency", rec, quiet) == rec
    hinted = {"readahead": [], "prefetch": {"hints": 12, "hinted_pages": 40, "read_pages": 30, "hit_rate": 0.1,
                                            "late_pages": 27}}
    (step,) = diagnose.pagecache_steps(hinted)
    assert step["step"] == "prefetch hints" and "27 were not resident" in step["finding"] and step["value"] == 0.1
