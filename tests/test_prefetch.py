"""Prefetch hit rate (engramprof/analysis/prefetch.py).

Without root: the maths on hand-made hints and read events.  With real eBPF: one traced child
prefetches rows of two cold files with POSIX_FADV_WILLNEED: in the first each page's hint is
issued just before its read (lead zero), in the second a step's hints go out 250 ms before its
reads (a long lead).  The files are on a loop device whose reads the child's blkio cgroup
throttles to 200 IOPS, so a page's I/O outlasts the gap between a hint and the read after it on
any host (on this VM's virtio disk some single-page reads finish within that gap).  Right before every read the child asks mincore(2) whether the page is
resident (cached and up to date: mincore never reads the page); the hit rate the trace gives
must agree with those answers, and be near 1 with the long lead and low with lead zero.
"""
from __future__ import annotations

import json
import os
import signal
import textwrap

import numpy as np
import pandas as pd
import pytest

from engramprof.analysis import prefetch
from engramprof.analysis.readahead import PAGE, PagecacheInputs
from tests.synthetic import fs_type
from tests.tracing import PY, Proc, engramprof


def _calls(rows):
    """(ts_ns, dur_ns, tid, path, offset, offcpu_ns) read events of 256 bytes."""
    df = pd.DataFrame(rows, columns=["ts_ns", "dur_ns", "tid", "path", "offset", "offcpu_ns"])
    df["size"] = 256
    df["runq_ns"] = 0
    df["pages_added"] = 0
    df["ret"] = 256
    df["major"] = False
    df["kind"] = "syscall"
    return df


def _hints(rows):
    """(ts_ns, path, first_page, pages, advice) hints."""
    df = pd.DataFrame(rows, columns=["ts_ns", "path", "first_page", "pages", "advice"])
    df["call"] = "fadvise"
    return df


def test_first_read_after_each_hint_decides_the_pair():
    hints = _hints([(100, "/t", 10, 2, "WILLNEED"), (100, "/t", 50, 1, "DONTNEED"), (500, "/t", 10, 1, "WILLNEED")])
    calls = _calls([(50, 5, 1, "/t", 10 * PAGE, 0),  # before any hint: not a pair's read
                    (200, 5, 1, "/t", 10 * PAGE, 0),  # hint 1, page 10: ready
                    (300, 5, 1, "/t", 10 * PAGE, 9),  # a second read of it: not the first
                    (400, 90, 1, "/t", 11 * PAGE, 80),  # hint 1, page 11: slept -> late
                    (600, 90, 1, "/t", 10 * PAGE, 80)])  # hint 2, page 10: late
    s = prefetch.summary(PagecacheInputs(calls, None, hints, None, False))
    assert s["hints"] == 2 and s["hinted_pages"] == 3  # DONTNEED is not a prefetch hint
    assert s["read_pages"] == 3 and s["late_pages"] == 2 and s["unread_pages"] == 0
    assert s["hit_rate"] == round(1 / 3, 4)


def test_a_read_that_inserted_the_page_or_got_eagain_is_late_and_unread_pairs_are_counted():
    hints = _hints([(100, "/t", 0, 4, "WILLNEED")])
    calls = _calls([(200, 5, 1, "/t", 0, 0), (210, 5, 1, "/t", PAGE, 0), (220, 5, 1, "/t", 2 * PAGE, 0)])
    calls.loc[1, "pages_added"] = 1
    calls.loc[2, "ret"] = -11  # EAGAIN (RWF_NOWAIT on a page still in flight)
    s = prefetch.summary(PagecacheInputs(calls, None, hints, None, False))
    assert (s["read_pages"], s["late_pages"], s["unread_pages"], s["hit_rate"]) == (3, 2, 1, round(1 / 3, 4))


def test_no_hints_no_rate():
    s = prefetch.summary(PagecacheInputs(_calls([]), None, None, None, False))
    assert s == {"hints": 0, "hinted_pages": 0, "hit_rate": None, "late_pages": 0, "read_pages": 0,
                 "unread_pages": 0}


# --------------------------------------------------------------------- real eBPF

CHILD = textwrap.dedent("""
    import ctypes, json, mmap, os, signal, sys, time
    import numpy as np
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    libc = ctypes.CDLL(None, use_errno=True)
    PS = mmap.PAGESIZE
    pages = json.loads(sys.argv[3])
    files = []
    for p in sys.argv[1:3]:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: only the hints bring pages in
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)  # for mincore only: never touched
        base = np.frombuffer(mm, dtype=np.uint8).ctypes.data
        files.append((fd, mm, base))
    vec = ctypes.c_ubyte()

    def resident(base, page):
        if libc.mincore(ctypes.c_void_p(base + page * PS), ctypes.c_size_t(PS), ctypes.byref(vec)):
            raise OSError(ctypes.get_errno(), "mincore")
        return vec.value & 1

    buf = bytearray(256)
    print("ready", file=sys.stderr, flush=True)
    signal.sigwait({signal.SIGUSR1})
    seen = {"zero": [], "long": []}
    fd, _, base = files[0]
    for pg in pages:  # lead zero: the hint just before the read
        os.posix_fadvise(fd, pg * PS, PS, os.POSIX_FADV_WILLNEED)
        seen["zero"].append(resident(base, pg))
        os.preadv(fd, [buf], pg * PS + 128)
    fd, _, base = files[1]
    for k in range(0, len(pages), 10):  # a long lead: a step's hints 250 ms before its reads
        step = pages[k:k + 10]
        for pg in step:
            os.posix_fadvise(fd, pg * PS, PS, os.POSIX_FADV_WILLNEED)
        time.sleep(0.25)
        for pg in step:
            seen["long"].append(resident(base, pg))
            os.preadv(fd, [buf], pg * PS + 128)
    print(json.dumps(seen))
""")


READ_IOPS = 200  # the child's reads of the loop device, throttled: a hint's page takes >= 5 ms


@pytest.fixture
def throttled_files(tmp_path):
    """Two 8 MiB files on an ext4 loop device (direct I/O: the backing file's cache cannot serve
    them) and a blkio cgroup throttling reads of it to READ_IOPS, so that a page's I/O lasts
    longer than the microseconds between a hint and the read after it whatever the host's disk.
    Removed (cgroup, mount, loop device) even on failure."""
    from engramprof.lab import host
    from engramprof.lab import impairments as faults

    if fs_type(tmp_path) in ("tmpfs", "ramfs"):
        pytest.skip("tmp is on tmpfs: the loop device's image needs a real filesystem")
    h = host.find_hierarchy("blkio")
    if h is None:
        pytest.skip("no blkio / io cgroup controller: reads cannot be throttled")
    loop = faults.LoopFilesystem()
    cg = None
    try:
        loop.create(str(tmp_path), 64 << 20)
        data = np.random.default_rng(4).integers(0, 256, size=8 << 20, dtype=np.uint8).tobytes()
        paths = []
        for name in ("zero.bin", "long.bin"):
            p = os.path.join(loop.mountpoint, name)
            with open(p, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            paths.append(p)
        cg = host.Cgroup(h, "prefetch-test")
        if h.version == 1:
            cg.write("blkio.throttle.read_iops_device", f"{loop.devno} {READ_IOPS}")
        else:
            cg.write("io.max", f"{loop.devno} riops={READ_IOPS}")
        yield tmp_path, paths, cg
    finally:
        if cg is not None:
            cg.remove()
        loop.remove()


def _rate_of(inp: PagecacheInputs, path: str) -> dict:
    h = inp.hints[inp.hints["path"] == path]
    return prefetch.summary(PagecacheInputs(inp.calls, inp.pagecache, h, inp.evictions, inp.evictions_recorded))


@pytest.mark.bpf
@pytest.mark.slow  # a traced child: the probes' compile takes most of it (seconds on a busy host)
def test_long_lead_hits_lead_zero_is_late_and_both_agree_with_mincore(throttled_files):
    from engramprof.analysis import readahead

    d, (zero, long_), cg = throttled_files
    pages = np.random.default_rng(6).choice((8 << 20) // PAGE, size=100, replace=False).tolist()
    child = Proc([PY, "-c", CHILD, str(zero), str(long_), json.dumps(pages)])
    out = d / "trace"
    try:
        child.wait_line("ready")
        with open(cg.procs, "w") as f:  # throttled from its first hint
            f.write(str(child.pid))
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
            child.p.wait()
    seen = json.loads(child_out)
    inp = readahead.load_inputs(out)
    z, lg = _rate_of(inp, str(zero)), _rate_of(inp, str(long_))
    assert z["hinted_pages"] == lg["hinted_pages"] == len(pages), (z, lg)
    assert z["read_pages"] == lg["read_pages"] == len(pages), (z, lg)
    mz, ml = float(np.mean(seen["zero"])), float(np.mean(seen["long"]))
    assert lg["hit_rate"] >= 0.9 and ml >= 0.9, (lg, ml)
    # lead zero: mostly late (seen 0.19, mincore 0.18: blk-throttle lets a slice's first bios through)
    assert z["hit_rate"] <= 0.4 and mz <= 0.4 and lg["hit_rate"] - z["hit_rate"] >= 0.5, (z, mz, lg)
    assert abs(lg["hit_rate"] - ml) <= 0.15 and abs(z["hit_rate"] - mz) <= 0.15, (lg, ml, z, mz)
    # and the bundle-level keys count both files' hints
    keys = prefetch.json_keys(out)["prefetch"]
    assert keys["hints"] == 2 * len(pages) and keys["hinted_pages"] == 2 * len(pages)


def test_an_madvise_range_is_cut_into_file_pages_at_the_mappings(tmp_path):
    """The decoder's address -> file page step on this process's own mappings (no root)."""
    import mmap

    from engramprof.record.sources.pagecache import ProcessFiles

    p = tmp_path / "m.bin"
    p.write_bytes(bytes(16 * PAGE))
    with open(p, "rb") as f:
        mm = mmap.mmap(f.fileno(), 8 * PAGE, prot=mmap.PROT_READ, offset=4 * PAGE)  # file pages 4..11
        try:
            base = np.frombuffer(mm, dtype=np.uint8).ctypes.data
            pf = ProcessFiles(os.getpid())
            (seg,) = [s for s in pf.segments(base + 2 * PAGE + 10, 3 * PAGE) if s[2] == str(p)]
            assert seg[3:] == (6, 4)  # from file page 4 + 2, the 3 pages and the partial one
            assert pf.covers(base) and not pf.covers(PAGE) and not pf.segments(PAGE, PAGE)  # page 1 is never mapped
        finally:
            mm.close()


@pytest.mark.bpf
@pytest.mark.slow  # a traced child: the probes' compile takes most of it (seconds on a busy host)
def test_lab_mmap_prefetch_hints_are_recorded_as_the_planned_file_pages(tmp_path):
    """lab run --reader mmap --prefetch willneed: every madvise(WILLNEED) the lab made is a hint
    row whose file pages are the planned rows' page runs (address -> file page through the
    mapping), and the summary counts them."""
    from engramprof.tables import safetensors as layout
    from engramprof.lab import readers, table, workload
    from tests.tracing import traced_lab

    if fs_type(tmp_path) in ("tmpfs", "ramfs"):
        pytest.skip("tmp is on tmpfs: no droppable page cache to prefetch into")
    t = tmp_path / "t.safetensors"
    table.make_table(t, rows=1 << 14, seed=8)
    steps, lead = 6, 2
    run = traced_lab(tmp_path, t, "--reader", "mmap", "--cold", "--steps", str(steps), "--gap-ms", "20",
                     "--prefetch", "willneed", "--prefetch-lead", str(lead), tracer_args=("--no-offcpu",))
    assert run.tracer_rc == 0, run.tracer_err
    plan = workload.Plan(layout.load(t), 4, 6, 1.1, 0)
    batches = [plan.next_batch() for _ in range(steps)]
    want = sorted((first, n) for b in batches[lead:] for s in b for first, n in readers.page_runs(s.offsets, s.row_bytes))
    h = pd.read_parquet(run.trace / "samples" / "pagecache_hints")
    h = h[(h["call"] == "madvise") & (h["advice"] == "WILLNEED")]
    assert run.lab["prefetch"]["hints"] == len(want) == len(h)
    assert set(h["path"]) == {str(t)} and (h["ret"] == 0).all()
    assert sorted(zip(h["first_page"].tolist(), h["pages"].tolist())) == want
    s = prefetch.json_keys(run.trace)["prefetch"]
    assert s["hints"] == len(want) and s["hinted_pages"] == sum(n for _, n in want)
