"""Every syscall read is named by the file the kernel read, not by its fd number (issue 22,
"Every read names its file from the kernel").

Real eBPF, the tensor-parallel shape of the field defect: ``syscalls --pid PARENT --children``,
a parent that had a ``.pth`` file open as its lowest fd at start-up (read, closed, before the
trace), then two ranks forked during the trace that open and close one file after another on
that same fd number -- tables and decoys, the start-up file itself once -- reading each with
pread64, lseek + read and lseek + readv, and last open / read / close per chunk (files never open
when /proc is looked at: named by the kernel at the open, engramprof/record/sources/names.py).  Each rank logs what it read; every read event must
carry the file its rank read (path, and the kernel's dev/ino = stat of that path), the file
position as read()'s offset, no read named from another file that held the fd, and no read left
unnamed.  The fd-number naming this replaces put 83% of such reads on the ``.pth`` file.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.tracing import Proc, engramprof

pytestmark = pytest.mark.bpf

FILE_PAGES = 256  # 1 MiB: each rank reads every page at most once (its reads' offsets are unique)
READS_PER_PHASE = 30
PHASES = 6  # five files opened for a while each, then open / read / close per chunk
CHUNKS = tuple(f"chunks/r{r}/c{i}.bin" for r in (0, 1) for i in range(3))

PARENT = r"""
import json, os, sys, time
d = sys.argv[1]
reads, gap, hold = int(sys.argv[2]), 0.005, 0.4
fd = os.open(f"{d}/startup.pth", os.O_RDONLY)   # the interpreter's .pth at start-up: read, closed
os.read(fd, 4096)
os.close(fd)
print(fd, flush=True)
sys.stdin.readline()                             # the tracer is attached
ORDER = {0: ["table_a.bin", "decoy.txt", "table_b.bin", "startup.pth", "table_a.bin"],
         1: ["table_b.bin", "table_a.bin", "decoy.txt", "table_b.bin", "decoy.txt"]}

def read_at(f, off, i):
    how = ("pread64", "read", "readv")[i % 3]
    if how == "pread64":
        os.pread(f, 512, off)
    else:
        os.lseek(f, off, os.SEEK_SET)
        os.read(f, 512) if how == "read" else os.readv(f, [bytearray(256), bytearray(256)])
    return how

def rank(r):
    log = []                                     # written at the end: an open log would take the fd
    k = 0
    for name in ORDER[r]:
        path = f"{d}/{name}"
        f = os.open(path, os.O_RDONLY)
        assert f == fd, (f, fd)                  # the same fd number, another file
        for i in range(reads):
            off, how = k * 4096, read_at(f, k * 4096, i)
            log.append(json.dumps({"pid": os.getpid(), "path": path, "offset": off, "syscall": how}))
            k += 1
            time.sleep(gap)
        time.sleep(hold)                         # open a while after its reads, then closed
        os.close(f)
    for i in range(reads):                       # open / read / close per chunk: never open when
        path = f"{d}/chunks/r{r}/c{i % 3}.bin"   # /proc is looked at (named by the kernel at open)
        f = os.open(path, os.O_RDONLY)
        assert f == fd, (f, fd)
        off, how = k * 4096, read_at(f, k * 4096, i)
        os.close(f)
        log.append(json.dumps({"pid": os.getpid(), "path": path, "offset": off, "syscall": how}))
        k += 1
        time.sleep(gap)
    with open(f"{d}/rank{r}.log", "w") as out:
        out.write("\n".join(log) + "\n")

kids = []
for r in (0, 1):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            rank(r)
            code = 0
        finally:
            os._exit(code)
    kids.append(pid)
sys.exit(max(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids))
"""


@pytest.fixture(scope="module")
def traced_ranks(tmp_path_factory):
    d = tmp_path_factory.mktemp("ranks")
    for name in ("table_a.bin", "table_b.bin", "decoy.txt", "startup.pth") + CHUNKS:
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(os.urandom(FILE_PAGES * 4096))
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(d), str(READS_PER_PHASE)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    out = d / "trace"
    tracer = None
    try:
        fd = int(parent.stdout.readline())
        tracer = Proc(engramprof("syscalls", "--pid", parent.pid, "--children", "--output", out, "--json",
                                 "--sample-hz", "0"))
        tracer.wait_line("Tracing", timeout=180)
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert parent.wait(timeout=120) == 0
        rc, stdout, err = tracer.finish(timeout=120)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if tracer is not None and tracer.p.poll() is None:
            tracer.p.kill()
            tracer.p.wait()
    assert rc == 0, err[-3000:]
    summary = json.loads(stdout)
    logged = [json.loads(line) for r in (0, 1) for line in (d / f"rank{r}.log").read_text().splitlines()]
    from engramprof.trace.reader import load_bundle

    calls = load_bundle(out).calls
    return d, fd, summary, logged, calls


def test_every_read_lands_on_the_file_its_rank_read(traced_ranks):
    d, fd, summary, logged, calls = traced_ranks
    pids = sorted({e["pid"] for e in logged})
    assert len(pids) == 2 and len(logged) == 2 * PHASES * READS_PER_PHASE
    ev = calls[calls["pid"].isin(pids) & (calls["kind"] == "syscall")]
    assert (ev["fd"] == fd).all(), ev["fd"].value_counts()  # every read on the reused fd number
    by_key = {(int(p), int(o)): r for p, o, r in zip(ev["pid"], ev["offset"], range(len(ev)))}
    assert len(by_key) == len(ev), "two events of a rank at one offset"
    wrong, missing = [], []
    for e in logged:
        i = by_key.get((e["pid"], e["offset"]))
        if i is None:
            missing.append(e)
            continue
        row = ev.iloc[i]
        st = os.stat(e["path"])
        got = (row["path"], row["syscall"], int(row["dev"]), int(row["ino"]))
        if got != (e["path"], e["syscall"], st.st_dev, st.st_ino):
            wrong.append((e, got))
    assert not missing, f"{len(missing)} logged reads not traced, e.g. {missing[:3]}"
    assert not wrong, f"{len(wrong)} of {len(logged)} reads on the wrong file, e.g. {wrong[:3]}"
    assert len(ev) == len(logged), "events the ranks did not log"
    assert not ev["path_stale"].any() and not ev["direct"].any()
    assert summary.get("unnamed_file_reads") == 0, summary.get("unnamed_file_reads")


def test_fd_histogram_and_files_table_name_the_reads(traced_ranks):
    """The start-up .pth is read by one phase of rank 0 only: its share of the events is that
    phase's, not the fd's (the defect named 83% of the reads after it)."""
    d, fd, summary, logged, calls = traced_ranks
    pth = str(d / "startup.pth")
    n_pth = sum(e["path"] == pth for e in logged)
    assert n_pth == READS_PER_PHASE
    assert int((calls["path"] == pth).sum()) == n_pth
