"""lab: table maker, readers (real and forced paths), workload, CLI. Small real files only."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from engramprof.tables import safetensors as layout
from engramprof.errors import UserError
from engramprof.lab import readers, table, workload
from engramprof.lab.readers import RWF_NOWAIT, Job, ShortReadError, make_reader
from tests.coldrun import until_nowait_refuses

ROWS, DIM, LAYERS = 4096, 64, (3, 17)
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tbl(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("lab") / "engram.safetensors"
    table.make_table(path, ROWS, DIM, LAYERS, seed=1)
    return path


@pytest.fixture(scope="module")
def content(tbl) -> bytes:
    return tbl.read_bytes()


@pytest.fixture
def fd(tbl):
    fd = readers.open_table(tbl)
    yield fd
    os.close(fd)


def _jobs(fd, lay, rows, layers=LAYERS) -> list[Job]:
    jobs = []
    for L in layers:
        for name in (table.weight_name(L), table.scale_name(L)):
            t = lay.tensor(name)
            offs = t.start + np.asarray(rows, dtype=np.int64) * t.row_bytes
            jobs.append(Job(fd, offs, t.row_bytes, np.zeros((len(offs), t.row_bytes), np.uint8)))
    return jobs


def _expected(content: bytes, job: Job) -> np.ndarray:
    return np.array([np.frombuffer(content[o:o + job.row_bytes], np.uint8) for o in job.offsets.tolist()])


class Scripted:
    """An os.preadv stand-in that records every call and follows ``rule(off, size, flags, n)``
    (n = how many earlier calls had this offset and flags): an exception to raise, an int
    number of bytes to really read (0 returns 0), or None for a full real read."""

    def __init__(self, rule=lambda *a: None):
        self.rule, self.calls, self._lock = rule, [], threading.Lock()

    def __call__(self, fd, bufs, off, flags=0):
        size = len(bufs[0])
        with self._lock:
            n = sum(1 for c in self.calls if c[0] == off and c[2] == flags)
            self.calls.append((off, size, flags, threading.current_thread().name))
        act = self.rule(off, size, flags, n)
        if isinstance(act, BaseException):
            raise act
        if act is None:
            return os.preadv(fd, bufs, off, flags)
        if act == 0:
            return 0
        return os.preadv(fd, [memoryview(bufs[0])[:act]], off, flags)


def _unique_total(jobs) -> int:
    return sum(len(np.unique(j.offsets)) for j in jobs)


# ---- make-table -------------------------------------------------------------------------

def test_make_table_header_matches_manual_parse(tbl, content):
    n = int.from_bytes(content[:8], "little")
    assert n % 8 == 0
    raw = content[8:8 + n]
    assert raw == raw.rstrip(b" ") + b" " * (len(raw) - len(raw.rstrip(b" ")))
    head = json.loads(raw)
    meta = head.pop("__metadata__")
    assert meta["engramprof"] == "lab-table"
    expect = {}
    for L in LAYERS:
        expect[table.weight_name(L)] = ("F8_E4M3", [ROWS, DIM])
        expect[table.scale_name(L)] = ("U8", [ROWS, DIM // 32])
    assert {k: (v["dtype"], v["shape"]) for k, v in head.items()} == expect
    spans = sorted(v["data_offsets"] for v in head.values())
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert len(content) == 8 + n + spans[-1][1]
    lay = layout.load(tbl)
    assert lay.data_start == 8 + n
    for name, v in head.items():
        t = lay.tensor(name)
        assert (t.start, t.end) == (8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1])
        assert t.row_bytes == v["shape"][1]
    assert table.engram_layers(lay) == list(LAYERS)
    # random contents: rows differ
    w = lay.tensor(table.weight_name(3))
    assert content[w.start:w.start + DIM] != content[w.start + DIM:w.start + 2 * DIM]


def test_make_table_refuses_existing_and_planted_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    link = tmp_path / "t.safetensors"
    link.symlink_to(victim)
    with pytest.raises(UserError, match="already exists"):
        table.make_table(link, 64, 32, (1,))
    assert victim.read_bytes() == b"precious"
    table.make_table(link, 64, 32, (1,), force=True)
    assert not link.is_symlink() and victim.read_bytes() == b"precious"
    assert layout.load(link).tensor("layers.1.engram.embed.weight").shape == (64, 32)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("rows,dim,layers", [(0, 64, (1,)), (8, 48, (1,)), (8, 64, ()), (8, 64, (2, 2))])
def test_make_table_rejects_bad_shapes(tmp_path, rows, dim, layers):
    with pytest.raises(UserError):
        table.make_table(tmp_path / "t", rows, dim, layers)
    assert not (tmp_path / "t").exists()


# ---- readers: real bytes ------------------------------------------------------------------

@pytest.mark.parametrize("name", readers.SYSCALL_READERS)
def test_readers_return_the_files_bytes(tbl, content, fd, name):
    lay = layout.load(tbl)
    rng = np.random.default_rng(7)
    rows = np.concatenate([rng.integers(0, ROWS, 300), [0, ROWS - 1, 5, 5, 5]])
    jobs = _jobs(fd, lay, rows)
    rec = Scripted()
    with make_reader(name, threads=4, preadv=rec) as r:
        stats = r.read_batch(jobs)
    for job in jobs:
        np.testing.assert_array_equal(job.out, _expected(content, job))
    assert stats.calls == len(rec.calls) == _unique_total(jobs)
    assert stats.eagain == 0 and stats.fallback_rows == 0
    threads = {c[3] for c in rec.calls}
    if name == "pool":
        assert all(t.startswith("engram-read") for t in threads)
    else:
        assert threads == {threading.current_thread().name}
    if name == "nowait":
        assert {c[2] for c in rec.calls} == {RWF_NOWAIT}


def test_all_readers_agree(tbl, fd):
    lay = layout.load(tbl)
    rows = np.random.default_rng(3).integers(0, ROWS, 500)
    outs = []
    for name in readers.READERS:
        jobs = _jobs(fd, lay, rows)
        with make_reader(name, threads=8) as r:
            r.read_batch(jobs)
        outs.append([j.out for j in jobs])
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", readers.MMAP_READERS)
def test_mmap_readers_return_the_files_bytes(tbl, content, fd, name):
    """The mapping gathers: byte for byte the file's rows (duplicates and both ends included),
    no preadv call, the pool variant on the pool's threads with the pool's chunk rule."""
    lay = layout.load(tbl)
    rng = np.random.default_rng(7)
    rows = np.concatenate([rng.integers(0, ROWS, 300), [0, ROWS - 1, 5, 5, 5]])
    jobs = _jobs(fd, lay, rows)
    rec = Scripted()
    seen = []
    real = readers._gather

    def spy(view, r, out):
        seen.append((threading.current_thread().name, len(r)))
        return real(view, r, out)

    readers._gather = spy
    try:
        with make_reader(name, threads=32, preadv=rec) as r:
            stats = r.read_batch(jobs)
            assert r._maps[fd].mm._mmap is not None
    finally:
        readers._gather = real
    for job in jobs:
        np.testing.assert_array_equal(job.out, _expected(content, job))
    assert stats.calls == 0 and rec.calls == []
    if name == "mmap":
        assert seen == [(threading.current_thread().name, len(rows))] * len(jobs)
    else:  # 4 jobs x 305 rows over 32 threads: ceil(1220 / 32) = 39 -> capped at 16 a task
        assert all(t.startswith("engram-read") for t, _ in seen)
        assert [n for _, n in seen] == ([16] * 19 + [1]) * len(jobs)


def test_mmap_reader_refuses_rows_outside_the_file(tbl, fd):
    with make_reader("mmap") as r, pytest.raises(ShortReadError):
        r.read_batch([Job(fd, np.array([os.path.getsize(tbl) - 4]), 8, np.zeros((1, 8), np.uint8))])


def test_workload_mmap_readers_write_markers(tbl, tmp_path):
    for name in readers.MMAP_READERS:
        markers = tmp_path / f"{name}.jsonl"
        res = workload.run_workload(tbl, name, steps=3, tokens=5, heads=6, seed=11, threads=4,
                                    markers=markers, cache="warm")
        lines = [json.loads(l) for l in markers.read_text().splitlines()]
        assert res["steps"] == 3 and res["calls"] == 0 and res["reader"] == name
        assert [l["rows"] for l in lines] == [120] * 3 and {l["reader"] for l in lines} == {name}
        assert {l["tid"] for l in lines} == {threading.get_native_id()}


class CountingPool:
    def __init__(self, inner):
        self.inner, self.sizes = inner, []

    def submit(self, fn, *args):
        self.sizes.append(len(args[4]))  # (preadv, fd, flat, row_bytes, idx, offs)
        return self.inner.submit(fn, *args)


@pytest.mark.parametrize("threads,rows,sizes", [
    (4, 20, [10] * 4),  # 2 jobs x 20 rows: ceil(40 / 4) = 10 rows a task
    (32, 3, [1] * 6),
    (4, 500, ([16] * 31 + [4]) * 2),  # capped at 16 rows a task; tasks never span jobs
])
def test_pool_task_size(tbl, fd, threads, rows, sizes):
    lay = layout.load(tbl)
    jobs = _jobs(fd, lay, np.arange(rows), layers=(3,))
    r = make_reader("pool", threads=threads)
    assert r.preadv is os.preadv
    r._pool = counting = CountingPool(r._pool)
    r.read_batch(jobs)
    r.close()
    r.close()  # idempotent
    assert counting.sizes == sizes
    with pytest.raises(ValueError):
        make_reader("mmap2")


# ---- nowait reader: forced paths ----------------------------------------------------------

def _run(tbl, fd, rule, rows=(1, 2, 3, 40, 41), reader="nowait"):
    lay = layout.load(tbl)
    jobs = _jobs(fd, lay, list(rows), layers=(3,))
    rec = Scripted(rule)
    r = make_reader(reader, threads=4, preadv=rec)
    try:
        stats = r.read_batch(jobs)
    finally:
        r.close()
    return jobs, stats, rec, r


def _target(tbl, row=2):
    return layout.load(tbl).tensor(table.weight_name(3)).row_offset(row)


def test_nowait_cached_hit(tbl, content, fd):
    jobs, stats, rec, _ = _run(tbl, fd, lambda *a: None)
    assert (stats.calls, stats.eagain, stats.fallback_rows) == (10, 0, 0)
    assert all(c[2] == RWF_NOWAIT for c in rec.calls)
    for j in jobs:
        np.testing.assert_array_equal(j.out, _expected(content, j))


def test_nowait_one_eagain_then_hit(tbl, content, fd):
    x = _target(tbl)
    rule = lambda off, size, flags, n: BlockingIOError(errno.EAGAIN, "x") if off == x and n == 0 else None
    jobs, stats, rec, _ = _run(tbl, fd, rule)
    assert (stats.eagain, stats.fallback_rows, stats.calls) == (1, 0, 11)
    assert [c[2] for c in rec.calls if c[0] == x] == [RWF_NOWAIT, RWF_NOWAIT]
    for j in jobs:
        np.testing.assert_array_equal(j.out, _expected(content, j))


def test_nowait_persistent_eagain_goes_to_pool(tbl, content, fd):
    x = _target(tbl)
    rule = lambda off, size, flags, n: BlockingIOError(errno.EAGAIN, "x") if off == x and flags else None
    jobs, stats, rec, _ = _run(tbl, fd, rule)
    assert (stats.eagain, stats.fallback_rows, stats.calls) == (2, 1, 12)
    xc = [c for c in rec.calls if c[0] == x]
    assert [c[2] for c in xc] == [RWF_NOWAIT, RWF_NOWAIT, 0]
    assert xc[-1][3].startswith("engram-read")
    for j in jobs:
        np.testing.assert_array_equal(j.out, _expected(content, j))


def test_nowait_zero_return_is_a_miss(tbl, content, fd):
    x = _target(tbl)
    jobs, stats, rec, _ = _run(tbl, fd, lambda off, size, flags, n: 0 if off == x and flags else None)
    assert (stats.eagain, stats.fallback_rows, stats.calls) == (0, 1, 12)
    for j in jobs:
        np.testing.assert_array_equal(j.out, _expected(content, j))


def test_nowait_short_return_is_a_miss_and_retried_whole(tbl, content, fd):
    x = _target(tbl)
    jobs, stats, rec, _ = _run(tbl, fd, lambda off, size, flags, n: 5 if off == x and n == 0 else None)
    assert (stats.eagain, stats.fallback_rows, stats.calls) == (0, 0, 11)
    assert [(c[1], c[2]) for c in rec.calls if c[0] == x] == [(DIM, RWF_NOWAIT)] * 2
    for j in jobs:
        np.testing.assert_array_equal(j.out, _expected(content, j))


@pytest.mark.parametrize("err", [errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS])
def test_nowait_unsupported_sends_whole_batch_to_pool_and_is_remembered(tbl, content, fd, err):
    # the flag is rejected on the 4th call, after three rows were already read with NOWAIT
    rule = lambda off, size, flags, n: OSError(err, os.strerror(err)) if flags and rule.seen() else None
    count = iter(range(10_000))
    rule.seen = lambda: next(count) >= 3
    lay = layout.load(tbl)
    rec = Scripted(rule)
    r = make_reader("nowait", threads=4, preadv=rec)
    try:
        jobs = _jobs(fd, lay, [1, 2, 3, 40, 41], layers=(3,))
        stats = r.read_batch(jobs)
        assert stats.nowait_unsupported and stats.fallback_rows == 10
        assert stats.calls == len(rec.calls) == 4 + 10
        assert [c[2] for c in rec.calls[4:]] == [0] * 10
        for j in jobs:
            np.testing.assert_array_equal(j.out, _expected(content, j))
        before = len(rec.calls)
        jobs = _jobs(fd, lay, [7, 8], layers=(3,))
        stats = r.read_batch(jobs)
        assert stats.nowait_unsupported and stats.calls == 4 == len(rec.calls) - before
        assert all(c[2] == 0 for c in rec.calls[before:])
    finally:
        r.close()


def test_nowait_other_errors_propagate(tbl, fd):
    rule = lambda off, size, flags, n: OSError(errno.EIO, "io error")
    with pytest.raises(OSError) as ei:
        _run(tbl, fd, rule)
    assert ei.value.errno == errno.EIO


@pytest.mark.parametrize("name", ["pool", "serial", "nowait"])
def test_blocking_partial_read_continues(tbl, content, fd, name):
    x = _target(tbl)
    rule = lambda off, size, flags, n: (BlockingIOError(errno.EAGAIN, "x") if flags and off == x
                                        else 10 if off == x else None)
    jobs, stats, rec, _ = _run(tbl, fd, rule, reader=name)
    blocking = [(c[0], c[1]) for c in rec.calls if c[2] == 0 and c[0] in (x, x + 10)]
    assert blocking == [(x, DIM), (x + 10, DIM - 10)]
    assert stats.calls == len(rec.calls)
    for j in jobs:
        np.testing.assert_array_equal(j.out, _expected(content, j))


@pytest.mark.parametrize("name", ["pool", "serial", "nowait"])
def test_terminal_short_read_raises(tbl, fd, name):
    x = _target(tbl)
    rule = lambda off, size, flags, n: (BlockingIOError(errno.EAGAIN, "x") if flags and off == x
                                        else 10 if off == x else 0 if off == x + 10 else None)
    with pytest.raises(ShortReadError, match="short read"):
        _run(tbl, fd, rule, reader=name)


@pytest.mark.parametrize("name", readers.SYSCALL_READERS)
def test_real_eof_raises(tbl, content, fd, name):
    job = Job(fd, np.array([len(content) - 3]), 8, np.zeros((1, 8), np.uint8))
    with make_reader(name, threads=2) as r, pytest.raises(ShortReadError):
        r.read_batch([job])


def test_job_validates_out():
    with pytest.raises(ValueError):
        Job(0, np.array([0, 8]), 8, np.zeros((2, 4), np.uint8))
    with pytest.raises(ValueError):
        Job(0, np.array([0]), 8, np.zeros((1, 8), np.int8))


# ---- workload ------------------------------------------------------------------------------

def test_workload_reads_exactly_the_plan(tbl, tmp_path):
    rec = Scripted()
    markers = tmp_path / "m.jsonl"
    res = workload.run_workload(tbl, "pool", steps=6, tokens=5, heads=6, seed=11, threads=4,
                                preadv=rec, record_reads=True, markers=markers)
    plan = workload.planned_reads(tbl, 6, tokens=5, heads=6, seed=11)
    assert res["reads"] == plan
    assert res["steps"] == 6 and res["rows"] == 6 * 4 * 5 * 6
    assert res["calls"] == len(rec.calls) == sum(len(b) for b in plan) == res["unique_rows"]
    assert sorted((c[0], c[1]) for c in rec.calls) == sorted(r for b in plan for r in b)
    lay = layout.load(tbl)
    offs = np.array([o for b in plan for o, _ in b])
    names, rows = lay.map_offsets(offs)
    sizes = np.array([s for b in plan for _, s in b])
    assert set(names) == {table.weight_name(L) for L in LAYERS} | {table.scale_name(L) for L in LAYERS}
    assert ((rows >= 0) & (rows < ROWS)).all()
    starts = np.array([lay.tensor(n).start for n in names])
    assert ((offs - starts) % sizes == 0).all()
    # weight and scale jobs of a layer read the same row ids
    b0 = workload.Plan(lay, 5, 6, 1.1, 11).next_batch()
    np.testing.assert_array_equal(lay.map_offsets(b0[0].offsets)[1], lay.map_offsets(b0[1].offsets)[1])
    lines = [json.loads(l) for l in markers.read_text().splitlines()]
    assert len(lines) == 6 and all(l["end_ns"] >= l["start_ns"] and l["reader"] == "pool" for l in lines)
    assert {l["tid"] for l in lines} == {threading.get_native_id()}
    assert [l["rows"] for l in lines] == [120] * 6
    assert all(a["end_ns"] <= b["start_ns"] for a, b in zip(lines, lines[1:]))


def test_workload_zipf_skews_rows():
    # a header-only layout of a big table: the plan needs shapes, not data
    raw = table.build_header(1 << 20, 256, LAYERS)
    lay = layout.parse_header("big", raw[8:], 1 << 40)

    def distinct(z):
        p = workload.Plan(lay, 64, 6, z, 0)
        return len(np.unique(np.concatenate([p.next_batch()[0].offsets for _ in range(20)])))

    assert distinct(1.5) < 0.7 * distinct(0.0)
    assert distinct(0.0) > 0.95 * 20 * 64 * 6


def test_workload_warm_nowait_hits_cold_misses(tmp_path):
    t = tmp_path / "own.safetensors"  # its own table: evicting it does not disturb other tests
    table.make_table(t, ROWS, DIM, LAYERS, seed=2)
    res = workload.run_workload(t, "nowait", steps=20, tokens=8, cache="warm")
    assert res["eagain"] == 0 and res["fallback_rows"] == 0 and res["calls"] == res["unique_rows"]
    # cold: the table is dropped, so RWF_NOWAIT reads of its rows get EAGAIN and are read again
    # blocking (in one of a few cold runs: tests/coldrun.py)
    res = until_nowait_refuses(
        lambda attempt: workload.run_workload(t, "nowait", steps=3, tokens=8, cache="cold", seed=5 + attempt),
        lambda res: res["eagain"])
    assert res["eagain"] > 0 and res["calls"] > res["unique_rows"], res


def test_workload_duration_and_stop(tbl):
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    t0 = time.monotonic()
    res = workload.run_workload(tbl, "serial", duration=30, gap_ms=5, stop=stop)
    assert time.monotonic() - t0 < 5 and res["steps"] > 0
    res = workload.run_workload(tbl, "serial", duration=0.2, gap_ms=20)
    assert 1 <= res["steps"] <= 11


def test_workload_rejects_non_engram_table(tmp_path):
    p = tmp_path / "x.safetensors"
    raw = json.dumps({"a": {"dtype": "U8", "shape": [4, 2], "data_offsets": [0, 8]}}).encode()
    raw += b" " * (-len(raw) % 8)
    p.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(8))
    with pytest.raises(UserError, match="no Engram layers"):
        workload.run_workload(p, steps=1)


# ---- CLI -------------------------------------------------------------------------------------

def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "engramprof", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO, timeout=60, **kw)


def test_cli_make_table_and_run_json(tmp_path):
    t = tmp_path / "t.safetensors"
    p = _cli("lab", "make-table", t, "--rows", 2048, "--dim", 64)
    assert p.returncode == 0, p.stderr
    assert "wrote" in p.stdout and t.stat().st_size == layout.load(t).size
    again = _cli("lab", "make-table", t, "--rows", 2048)
    assert again.returncode == 2 and again.stderr.strip().startswith("engramprof:")
    assert "already exists" in again.stderr and "Traceback" not in again.stderr
    m = tmp_path / "m.jsonl"
    p = _cli("lab", "run", "--table", t, "--reader", "nowait", "--steps", 4, "--warm", "--json",
             "--markers", m)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert {"steps", "rows", "calls", "eagain", "fallback_rows", "batch_ms", "reader", "pid"} <= res.keys()
    assert set(res["batch_ms"]) >= {"p50", "p99"}
    assert res["steps"] == 4 and res["reader"] == "nowait" and res["rows"] == 4 * 4 * 4 * 6
    assert f"lab: pid {res['pid']}" in p.stderr
    assert len(m.read_text().splitlines()) == 4


def test_cli_bad_input_is_one_line_error(tmp_path):
    p = _cli("lab", "run", "--table", tmp_path / "missing", "--steps", 1)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "no such file" in p.stderr
    p = _cli("lab", "run", "--table", tmp_path, "--reader", "mmap2")
    assert p.returncode == 2 and "--reader must be one of" in p.stderr


def test_cli_run_sigterm_ends_cleanly_with_summary(tbl):
    proc = subprocess.Popen([sys.executable, "-m", "engramprof", "lab", "run", "--table", str(tbl),
                             "--duration", "60", "--gap-ms", "10", "--json"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    assert line.startswith(f"lab: pid {proc.pid}")
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    res = json.loads(out)
    assert res["pid"] == proc.pid and res["steps"] >= 1


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm (tmpfs) to try RWF_NOWAIT on")
def test_nowait_refusal_is_remembered_per_filesystem(tbl, content, fd, tmp_path):
    """tmpfs rejects RWF_NOWAIT here (EOPNOTSUPP): a table there goes to the pool, while a
    table on another filesystem keeps its NOWAIT fast path in the same reader."""
    import shutil
    import tempfile

    shm = tempfile.NamedTemporaryFile(dir="/dev/shm", prefix="engramprof-test-")
    shutil.copyfile(tbl, shm.name)
    fd_shm = os.open(shm.name, os.O_RDONLY)
    if os.fstat(fd_shm).st_dev == os.fstat(fd).st_dev:
        pytest.skip("the test table is on tmpfs too")
    seen = []

    def pv(f, bufs, off, flags=0):
        seen.append((f, flags))
        return os.preadv(f, bufs, off, flags)

    lay = layout.load(tbl)
    r = make_reader("nowait", threads=4, preadv=pv)
    try:
        try:
            os.preadv(fd_shm, [bytearray(1)], 0, RWF_NOWAIT)
            pytest.skip("this kernel's tmpfs accepts RWF_NOWAIT")
        except OSError:
            pass
        jobs = _jobs(fd_shm, lay, [1, 2, 3], layers=(3,))
        stats = r.read_batch(jobs)
        assert stats.nowait_unsupported
        for j in jobs:
            np.testing.assert_array_equal(j.out, _expected(content, j))
        os.pread(fd, os.fstat(fd).st_size, 0)  # cache the ext4 table
        seen.clear()
        jobs = _jobs(fd, lay, [4, 5], layers=(3,))
        stats = r.read_batch(jobs)
        assert not stats.nowait_unsupported and stats.fallback_rows == 0
        assert seen and all(flags == RWF_NOWAIT for _, flags in seen)
        for j in jobs:
            np.testing.assert_array_equal(j.out, _expected(content, j))
    finally:
        r.close()
        os.close(fd_shm)
        shm.close()


def test_cli_run_survives_a_storm_of_signals(tbl):
    """SIGUSR1 over and over while the reader waits to start (--start-delay 60), then SIGTERM:
    it starts and ends at once, whichever thread the kernel gives each signal to.  With the
    signals blocked in the main thread and a sigwait thread (tried first), 5 of 5 runs hung:
    the kernel gave them to numpy's native thread, whose Python handler waits for the main
    thread to run bytecode, asleep in its 60 s wait.  The wakeup pipe has no such hole."""
    for _ in range(3):
        res, pid = _signal_storm(tbl)
        assert res["pid"] == pid and res["steps"] >= 1  # it started on SIGUSR1, not after 60 s


def test_cli_run_workers_survives_a_storm_of_signals(tbl):
    """`lab run --workers 2`: the ranks' parent (numpy's native threads too, started before it
    could block anything) takes a storm of SIGUSR1 while the ranks wait to start (--start-delay
    60), then of SIGTERM: it passes both on and ends at once with the ranks' summary, whichever
    of its threads the kernel gives each signal to."""
    for _ in range(3):
        res, pid = _signal_storm(tbl, "--workers", "2", stops=100)
        assert res["pid"] == pid and res["workers"] == 2
        assert all(r["steps"] >= 1 for r in res["ranks"]), res["ranks"]  # they started on SIGUSR1, not after 60 s


def _signal_storm(tbl, *lab_args: str, stops: int = 1) -> tuple[dict, int]:
    """`lab run --start-delay 60 LAB_ARGS`: 30 SIGUSR1 once it is ready, then ``stops`` SIGTERM
    (a stop signal the kernel may give any thread while it winds down); its JSON summary and pid.
    It must end at once with status 0 (killed, and its ranks with it, if it hangs)."""
    proc = subprocess.Popen([sys.executable, "-m", "engramprof", "lab", "run", "--table", str(tbl), *lab_args,
                             "--duration", "60", "--gap-ms", "1", "--start-delay", "60", "--json"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not proc.stderr.readline().startswith("lab: ready"):
            assert proc.poll() is None
        for _ in range(30):
            proc.send_signal(signal.SIGUSR1)
            time.sleep(0.002)
        time.sleep(0.3)
        for _ in range(stops):
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:  # hung (the ranks die with it: PR_SET_PDEATHSIG)
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    return json.loads(out), proc.pid


def test_ranks_distinct_rows_is_over_the_union_of_their_rows(tmp_path):
    """The parent's distinct_rows counts a row read by two ranks once (per table file: two
    names of one file are one table), and rows of different tables apart."""
    from engramprof.lab import ranks

    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"a")
    b.write_bytes(b"b")
    os.link(a, tmp_path / "a2.bin")

    def rank(table, offsets):
        return {"steps": 1, "distinct_rows": len(offsets), "distinct_offsets": sorted(offsets), "table": str(table)}

    out = ranks.combine([rank(a, {0, 64, 128}), rank(tmp_path / "a2.bin", {64, 128, 192}), rank(b, {0, 64})])
    assert out["distinct_rows"] == 4 + 2
    assert all("distinct_offsets" not in r for r in out["ranks"])
    assert [r["distinct_rows"] for r in out["ranks"]] == [3, 3, 2]  # each rank's own, as it read them


def test_cli_run_workers_reading_one_table_whole_counts_its_rows_once(tbl):
    """Two ranks given the same --rank-table (the same seed: the same rows) read the same
    distinct rows; the parent's distinct_rows is theirs, not twice it.  Shards of one table
    are disjoint: there it is the ranks' sum."""
    r = _cli("lab", "run", "--table", str(tbl), "--workers", "2", "--rank-table", f"0:{tbl}", "--rank-table",
             f"1:{tbl}", "--steps", "10", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    own = [x["distinct_rows"] for x in res["ranks"]]
    assert own[0] == own[1] > 0 and res["distinct_rows"] == own[0]
    r = _cli("lab", "run", "--table", str(tbl), "--workers", "2", "--steps", "10", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["distinct_rows"] == sum(x["distinct_rows"] for x in res["ranks"]) > 0
