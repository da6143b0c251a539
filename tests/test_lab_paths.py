"""The lab's other read paths (issue 22): ``uring`` (io_uring), ``direct`` (O_DIRECT preadv from
the pool), ``read`` (open/lseek/read()/close per row) and ``aio`` (Linux AIO on O_DIRECT).

Real files, real syscalls, real processes: the bytes each reader returns, that it really took
its path (the io_uring fd and a flat syscr, read() calls in syscr, a page cache left cold by
O_DIRECT), its refusals (tmpfs, a filesystem without O_DIRECT, io_uring refused), and every
lab scenario run with it.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from engramprof.host import residency
from engramprof.lab import direct_io, readers, scenarios, table, uring
from engramprof.lab.readers import Job, make_reader
from engramprof.lab.scenarios import Scenario
from engramprof.tables import safetensors as layout
from tests.test_scenarios import leftovers, markers_of

NEW = readers.PATH_READERS
ROWS, DIM, LAYERS = 4096, 64, (3, 17)
REPO = Path(__file__).resolve().parents[1]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mounts, cgroups, loop devices)")


@pytest.fixture(scope="module")
def tbl(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("paths") / "engram.safetensors"
    table.make_table(path, ROWS, DIM, LAYERS, seed=5)
    return path


@pytest.fixture(scope="module")
def content(tbl) -> bytes:
    return tbl.read_bytes()


@pytest.fixture
def fd(tbl):
    fd = readers.open_table(tbl)
    yield fd
    os.close(fd)


def _jobs(fd, lay, rows) -> list[Job]:
    jobs = []
    for L in LAYERS:
        for name in (table.weight_name(L), table.scale_name(L)):
            t = lay.tensor(name)
            offs = t.start + np.asarray(rows, dtype=np.int64) * t.row_bytes
            jobs.append(Job(fd, offs, t.row_bytes, np.zeros((len(offs), t.row_bytes), np.uint8)))
    return jobs


def _expected(content: bytes, job: Job) -> np.ndarray:
    return np.array([np.frombuffer(content[o:o + job.row_bytes], np.uint8) for o in job.offsets.tolist()])


# ---- bytes --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NEW)
def test_reader_returns_the_pool_readers_bytes(tbl, content, fd, name):
    """Duplicates, both ends of every tensor, 300 random rows: byte for byte the file's rows and
    the pool reader's; one read request per distinct row of each job."""
    lay = layout.load(tbl)
    rows = np.concatenate([np.random.default_rng(7).integers(0, ROWS, 300), [0, ROWS - 1, 5, 5, 5]])
    jobs, ref = _jobs(fd, lay, rows), _jobs(fd, lay, rows)
    with make_reader(name, threads=4) as r, make_reader("pool", threads=4) as pool:
        r.prepare(fd)
        stats = r.read_batch(jobs)
        pool.read_batch(ref)
    for job, want in zip(jobs, ref):
        np.testing.assert_array_equal(job.out, _expected(content, job))
        np.testing.assert_array_equal(job.out, want.out)
    assert stats.calls == sum(len(np.unique(j.offsets)) for j in jobs)
    assert stats.eagain == 0 and stats.fallback_rows == 0


@pytest.mark.parametrize("name", NEW)
def test_reader_reads_unaligned_rows_up_to_the_last_byte_and_more_than_a_round(tbl, content, fd, name):
    """Rows at arbitrary byte offsets (a replay's), 4 KiB boundaries crossed, the file's last
    bytes (an O_DIRECT extent cut short by end of file), and 2,600 rows in one job: more than
    an io_uring's entries or an AIO context's events, so several rounds."""
    size = len(content)
    offs = np.concatenate([[0, 1, 4093, 4095, 8191, size - 301, size - 300],
                           np.random.default_rng(1).choice(size - 300, 2600, replace=False)])
    job = Job(fd, offs, 300, np.zeros((len(offs), 300), np.uint8))
    tail = Job(fd, np.array([size - 37]), 37, np.zeros((1, 37), np.uint8))
    with make_reader(name, threads=8) as r:
        r.read_batch([job, tail])
    np.testing.assert_array_equal(job.out, _expected(content, job))
    np.testing.assert_array_equal(tail.out, _expected(content, tail))


@pytest.mark.parametrize("name", NEW)
def test_reader_past_the_end_is_an_error_not_stale_bytes(tbl, fd, name):
    size = os.path.getsize(tbl)
    with make_reader(name) as r, pytest.raises(OSError):
        r.read_batch([Job(fd, np.array([size - 4]), 8, np.zeros((1, 8), np.uint8))])


# ---- the path each reader really takes (a process of its own) --------------------------------

PROBE = r"""
import json, os, sys
from engramprof.lab import workload

def io():
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(":") for line in f)}

before, links = {}, []

def on_ready():  # after the table is opened, prepared and warmed or evicted; before step 1
    for n in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{n}"))
        except OSError:
            pass
    before.update(io())

res = workload.run_workload(sys.argv[1], sys.argv[2], steps=int(sys.argv[3]), tokens=8, heads=6, seed=3,
                            threads=8, cache=sys.argv[4], record_reads=True, on_ready=on_ready)
after = io()
reads = [r for b in res.pop("reads") for r in b]
print(json.dumps({"summary": res, "reads": reads, "syscr": after["syscr"] - before["syscr"], "links": links}))
"""


def _probe(tbl, reader: str, steps: int = 10, cache: str = "cold") -> dict:
    p = subprocess.run([sys.executable, "-c", PROBE, str(tbl), reader, str(steps), cache], capture_output=True,
                       text=True, cwd=REPO, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_uring_reader_reads_through_an_io_uring(tbl):
    """The reader's process holds an io_uring fd, and its rows never go through a read syscall:
    syscr does not move while it reads hundreds of rows."""
    got = _probe(tbl, "uring", cache="warm")
    s = got["summary"]
    assert "anon_inode:[io_uring]" in got["links"]
    assert s["calls"] == s["unique_rows"] >= 300
    assert got["syscr"] < s["unique_rows"] / 20, got["syscr"]


def test_read_reader_makes_one_read_call_per_row(tbl):
    got = _probe(tbl, "read", cache="warm")
    s = got["summary"]
    assert s["calls"] == s["unique_rows"] >= 300
    assert s["calls"] <= got["syscr"] <= s["calls"] + 20, (got["syscr"], s["calls"])
    assert "anon_inode:[io_uring]" not in got["links"]


def _resident(tbl, reads) -> np.ndarray:
    """Each read row's resident fraction (mincore: nothing is faulted in)."""
    offs = np.array([o for o, _ in reads], dtype=np.int64)
    sizes = np.array([n for _, n in reads], dtype=np.int64)
    return residency.classify_rows(str(tbl), offs, sizes)


@pytest.mark.parametrize("name", readers.DIRECT_READERS)
def test_o_direct_readers_leave_a_cold_table_cold(tbl, name):
    """Evicted, then read by the O_DIRECT reader: not one page of the rows it read comes into
    the page cache (mincore, which faults nothing in).  The pool reader on the same evicted
    table leaves every row's pages cached: the check sees pages when there are some."""
    got = _probe(tbl, name)
    assert got["summary"]["calls"] >= got["summary"]["unique_rows"] >= 300
    frac = _resident(tbl, got["reads"])
    assert len(frac) == len(got["reads"]) and frac.max() == 0.0, f"{(frac > 0).sum()} rows cached"
    control = _probe(tbl, "pool", steps=3)
    assert _resident(tbl, control["reads"]).min() == 1.0


# ---- lab run: summary and markers ---------------------------------------------------------------

def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "engramprof", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO, timeout=120, **kw)


def test_lab_run_summary_and_markers_are_the_pool_readers(tbl, tmp_path):
    keys = None
    for name in ("pool", *NEW):
        m = tmp_path / f"{name}.jsonl"
        p = _cli("lab", "run", "--table", tbl, "--reader", name, "--steps", 4, "--cold", "--json", "--markers", m)
        assert p.returncode == 0, p.stderr
        res = json.loads(p.stdout)
        keys = keys or set(res)
        assert set(res) == keys and res["reader"] == name and res["steps"] == 4 and res["rows"] == 4 * 4 * 4 * 6
        lines = [json.loads(x) for x in m.read_text().splitlines()]
        assert [x["step"] for x in lines] == [0, 1, 2, 3] and {x["reader"] for x in lines} == {name}
        assert [x["rows"] for x in lines] == [96] * 4 and all(x["start_ns"] <= x["end_ns"] for x in lines)


# ---- refusals: one line -------------------------------------------------------------------------

def _one_line_error(p, code: int, *words: str) -> None:
    assert p.returncode == code, (p.returncode, p.stderr)
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("engramprof: "), p.stderr
    assert "Traceback" not in p.stderr and "lab: pid" not in p.stderr
    for w in words:
        assert w in p.stderr, p.stderr


def _fs_magic(path: str) -> int | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        return direct_io.fs_magic(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("name", readers.DIRECT_READERS)
def test_o_direct_readers_refuse_tmpfs_in_one_line(tbl, name):
    """Linux 6.6+ opens tmpfs files with O_DIRECT, but they are page cache: nothing to bypass."""
    if not os.path.isdir("/dev/shm") or _fs_magic("/dev/shm") != direct_io.TMPFS_MAGIC:
        pytest.skip("no tmpfs at /dev/shm")
    d = tempfile.mkdtemp(dir="/dev/shm", prefix="engramprof-test-")
    try:
        t = shutil.copy(tbl, d)
        _one_line_error(_cli("lab", "run", "--table", t, "--reader", name, "--steps", 1), 2, "tmpfs", name)
    finally:
        shutil.rmtree(d)


@needs_root
def test_o_direct_readers_refuse_a_filesystem_without_o_direct(tbl, tmp_path):
    """ramfs refuses O_DIRECT at open (EINVAL): one line, exit 2, before the reader's pid line."""
    mnt = tmp_path / "ramfs"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "ramfs", "ramfs", str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount ramfs here")
    try:
        t = shutil.copy(tbl, mnt)
        for name in readers.DIRECT_READERS:
            _one_line_error(_cli("lab", "run", "--table", t, "--reader", name, "--steps", 1), 2, "O_DIRECT", name)
        p = _cli("lab", "run", "--table", t, "--reader", "read", "--steps", 1, "--json")
        assert p.returncode == 0, p.stderr  # the buffered readers do not care
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


# a seccomp filter that fails io_uring_setup (425 on every architecture) with EPERM, then exec
SECCOMP_EXEC = r"""
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
prog = [(0x20, 0, 0, 0), (0x15, 0, 1, 425), (0x06, 0, 0, 0x00050000 | 1), (0x06, 0, 0, 0x7fff0000)]
buf = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *f) for f in prog))
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fp = Fprog(len(prog), ctypes.addressof(buf))
if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.byref(fp), 0, 0):
    sys.exit(77)
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


def test_uring_reader_refused_io_uring_is_one_line(tbl):
    """io_uring_setup refused by the kernel (a seccomp filter here, as a container runtime's
    default profile does; kernel.io_uring_disabled = 2 refuses it the same way, EPERM)."""
    p = subprocess.run([sys.executable, "-c", SECCOMP_EXEC, "-m", "engramprof", "lab", "run", "--table", str(tbl),
                        "--reader", "uring", "--steps", "1"], capture_output=True, text=True, cwd=REPO, timeout=60)
    if p.returncode == 77:
        pytest.skip("cannot install a seccomp filter here")
    _one_line_error(p, 1, "io_uring", "Operation not permitted", "another --reader")


def test_io_uring_disabled_setting_is_named(tmp_path, monkeypatch):
    """The line for EPERM names kernel.io_uring_disabled's value (the sysctl itself is not
    changed here: it is host-wide)."""
    f = tmp_path / "io_uring_disabled"
    for value, words in (("2", "disabled on this host"), ("1", "io_uring_group")):
        f.write_text(value + "\n")
        monkeypatch.setattr(uring, "IO_URING_DISABLED", str(f))
        exc = uring.setup_error(errno.EPERM)
        assert f"kernel.io_uring_disabled = {value}" in str(exc) and words in str(exc) and exc.code == 1
    assert "no io_uring" in str(uring.setup_error(errno.ENOSYS))


# ---- every scenario with every new reader -------------------------------------------------------

@needs_root
@pytest.mark.parametrize("name", NEW)
def test_healthy_scenario_with_each_reader(name):
    with Scenario("healthy", rows=1 << 16, steps=30, gap_ms=5, reader=name) as sc:
        s = sc.wait()
        marks = markers_of(sc.markers_path)
    assert s["reader"] == name and s["cache"] == "warm" and s["steps"] == 30 and s["calls"] == s["unique_rows"]
    assert len(marks) == 30 and {m["reader"] for m in marks} == {name}
    assert leftovers(os.getpid()) == []


@needs_root
@pytest.mark.parametrize("scenario", [n for n in scenarios.SCENARIOS if n != "healthy"])
def test_every_scenario_runs_each_reader(scenario):
    """Each of the other scenarios, with each new reader in turn: it runs to its steps, the
    reader is the one asked for, every batch has its marker, nothing is left behind."""
    for name in NEW:
        with Scenario(scenario, rows=1 << 16, steps=8, gap_ms=5, reader=name) as sc:
            s = sc.wait()
            marks = markers_of(sc.markers_path)
        assert s["reader"] == name and s["steps"] == 8, (scenario, name, s)
        assert len(marks) == 8 and {m["reader"] for m in marks} == {name}, (scenario, name)
    assert leftovers(os.getpid()) == []
