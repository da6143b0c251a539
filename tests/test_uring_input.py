"""io_uring bad input (issue 22): rings that are not one process reading table files.

One recording (`engramprof syscalls --pid P --children`, real eBPF) of a target that
- reads 64 pages of file A through its ring (IORING_OP_READV, the liburing binding);
- reads a pipe through the ring (offset -1);
- forks a child that reads 32 pages of file B through the same ring (a ring shared by two
  processes: the child has the ring's fd and its mappings).
Every read request is credited to the process that submitted it and to the file it read (from
the kernel's (dev, ino) at completion); the pipe read is not a read event, it is counted
(``nonregular``) and named in the summary.

A second target sets up a ring and submits only NOPs (a ring with no file read): the recording
ends with one note, not a traceback and not an empty table.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engramprof import trace
from tests.tracing import engramprof

pytestmark = pytest.mark.bpf
pytest.importorskip("liburing", reason="the liburing binding is a dev dependency (make setup installs it)")

TARGET = r"""
import os, sys, time
from engramprof.lab.uring import Ring
a, b = sys.argv[1], sys.argv[2]
ring = Ring(64)
print("ready", flush=True)
sys.stdin.readline()
fa = os.open(a, os.O_RDONLY)
bufs = [bytearray(4096) for _ in range(64)]
ring.read_all([(fa, memoryview(bufs[i]), 4096 * i) for i in range(64)])
r, w = os.pipe()
os.write(w, b"x" * 4096)
ring.read_all([(r, memoryview(bytearray(4096)), 2**64 - 1)])  # -1: the file position
# the child goes on with the ring (liburing's SQ tail is process memory: once the child has
# submitted, the parent's copy is stale, so the parent does not submit again)
pid = os.fork()
if pid == 0:  # the child: same ring, another file
    fb = os.open(b, os.O_RDONLY)
    ring.read_all([(fb, memoryview(bufs[i]), 4096 * i) for i in range(32)])
    time.sleep(2.5)  # a rank lives on: the recorder names B from its open files
    os._exit(0)
os.waitpid(pid, 0)
print(pid, flush=True)
time.sleep(1.0)
"""

NOPS = r"""
import sys, time, liburing
ring = liburing.Ring()
liburing.io_uring_queue_init(8, ring)
print("ready", flush=True)
sys.stdin.readline()
cqe = liburing.Cqe()
for _ in range(200):
    sqe = liburing.io_uring_get_sqe(ring)
    liburing.io_uring_prep_nop(sqe)
    liburing.io_uring_submit_and_wait(ring, 1)
    liburing.io_uring_wait_cqe(ring, cqe)
    liburing.io_uring_cqe_seen(ring, cqe[0])
time.sleep(1.5)
"""


def _record(script: str, args: list[str], out: Path, *tracer_args: str) -> tuple[subprocess.CompletedProcess, str]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    w = subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=env)
    try:
        assert w.stdout.readline().strip() == "ready"
        t = subprocess.Popen(engramprof("syscalls", "--pid", str(w.pid), *tracer_args, "-o", out, "--duration", "30"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_line(t, "Tracing")
        w.stdin.write("go\n")
        w.stdin.flush()
        said = w.stdout.readline().strip()
        w.wait(timeout=60)
        # the target gone, the recorder ends by itself (end reason target-exit)
        stdout, stderr = t.communicate(timeout=120)
        return subprocess.CompletedProcess(t.args, t.returncode, stdout, stderr), said
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()


def _wait_line(p: subprocess.Popen, prefix: str) -> None:
    for line in p.stderr:
        if line.startswith(prefix):
            return
    raise AssertionError(f"the recorder ended before {prefix!r}: rc {p.wait()}")


def test_a_shared_ring_and_a_pipe_read(tmp_path):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    for f in (a, b):
        f.write_bytes(os.urandom(64 * 4096))
    out = tmp_path / "trace"
    p, said = _record(TARGET, [str(a), str(b)], out, "--children")
    assert p.returncode == 0, p.stderr
    child = int(said)
    calls = trace.load(out)
    ur = calls[calls["kind"].astype(str) == "io_uring"]
    by = ur.groupby(["pid", "path"]).size().to_dict()
    parent = int(ur["pid"].min()) if child > ur["pid"].min() else int(ur["pid"].max())
    # each request credited to the process that submitted it and the file it read; no pipe event
    assert by == {(parent, str(a)): 64, (child, str(b)): 32}, by
    assert (ur["ret"] == 4096).all()
    st_a, st_b = os.stat(a), os.stat(b)
    ids = set(zip(ur["dev"].astype(int), ur["ino"].astype(int), ur["path"]))
    assert ids == {(st_a.st_dev, st_a.st_ino, str(a)), (st_b.st_dev, st_b.st_ino, str(b))}, ids
    said_out = " ".join(p.stdout.split())  # the summary wraps at 80 columns
    assert "96 read requests completed of 97 submitted" in said_out, p.stdout
    assert "1 read of pipes, sockets or procfs left out" in said_out, p.stdout


def test_a_ring_without_file_reads_is_one_note(tmp_path):
    out = tmp_path / "trace"
    p, _ = _record(NOPS, [], out)
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 0, p.stderr
    said_out = " ".join(p.stdout.split())
    assert "made no preadv2/preadv/pread64/read/readv call of a file" in said_out and "no io_uring read request" in said_out, p.stdout
    calls = trace.load(out)
    assert (calls["kind"].astype(str) == "io_uring").sum() == 0
