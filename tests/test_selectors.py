"""Selecting the target (issue 13): --pid repeated, --children, --cgroup, --file (real eBPF)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from engramprof import trace as tracefmt
from tests.tracing import Proc, engramprof


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sel") / "engram.safetensors"
    subprocess.run(engramprof("lab", "make-table", path, "--rows", "8192"), check=True, capture_output=True)
    return path


def start_reader(table: Path, *args: str) -> Proc:
    lab = Proc(engramprof("lab", "run", "--table", table, "--json", "--start-delay", "120", "--reader", "serial",
                          "--steps", "8", "--tokens", "4", "--warm", *args))
    lab.wait_line("lab: ready", timeout=240)
    return lab


def finish_reader(lab: Proc) -> dict:
    rc, out, err = lab.finish()
    assert rc == 0, err
    return json.loads(out)


def trace_of(tmp: Path, name: str, *selector: str, sample_hz: str = "0") -> tuple[Proc, Path]:
    out = tmp / name
    tracer = Proc(engramprof("syscalls", *selector, "--output", out, "--json", "--sample-hz", sample_hz, "--no-offcpu"))
    tracer.wait_line("Tracing", timeout=240)  # BCC compiles the probes: minutes on a loaded 2-core machine
    return tracer, out


def syscall_events(df):
    return df[df["kind"] == "syscall"].reset_index(drop=True)


def counts_by_pid(trace: Path) -> dict[int, int]:
    df = syscall_events(tracefmt.load(trace))
    return {int(k): int(v) for k, v in df["pid"].value_counts().items()}


@pytest.mark.bpf
def test_two_pids_each_seen_whole(tmp_path, table):
    a, b = start_reader(table), start_reader(table)
    tracer, out = trace_of(tmp_path, "two", "--pid", str(a.pid), "--pid", str(b.pid), sample_hz="20")
    for lab in (a, b):
        os.kill(lab.pid, signal.SIGUSR1)
    la, lb = finish_reader(a), finish_reader(b)
    rc, _, err = tracer.finish()
    assert rc == 0, err
    meta = json.loads((out / "meta.json").read_text())
    assert meta["end_reason"] == "target-exit" and meta["pids"] == [a.pid, b.pid] and meta["pid"] == a.pid
    assert counts_by_pid(out) == {a.pid: la["calls"], b.pid: lb["calls"]}
    # the per-thread samplers follow both processes (each thread under its own pid)
    threads = tracefmt.load_bundle(out).samples("threads")
    assert set(threads["pid"]) == {a.pid, b.pid}
    assert all(pid in set(g["tid"]) for pid, g in threads.groupby("pid"))
    r = subprocess.run(engramprof("batch-tail", out, "--json"), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(p["pid"] for p in json.loads(r.stdout)["processes"]) == sorted([a.pid, b.pid])


PARENT = r"""
import json, signal, subprocess, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
print("parent: ready", file=sys.stderr, flush=True)
signal.sigwait({signal.SIGUSR1})
argv = sys.argv[1:]
kids = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(2)]
print(json.dumps([{"pid": k.pid, **json.loads(k.communicate()[0])} for k in kids]))
"""


@pytest.mark.bpf
def test_children_forked_after_start_are_seen_whole(tmp_path, table):
    reader = engramprof("lab", "run", "--table", table, "--json", "--reader", "serial", "--steps", "8",
                        "--tokens", "4", "--warm")
    parent = Proc([reader[0], "-c", PARENT, *map(str, reader)])
    parent.wait_line("parent: ready")
    tracer, out = trace_of(tmp_path, "tree", "--pid", str(parent.pid), "--children")
    os.kill(parent.pid, signal.SIGUSR1)
    rc, pout, perr = parent.finish()
    assert rc == 0, perr
    kids = json.loads(pout)
    rc, _, err = tracer.finish()  # ends by itself: every target has exited
    assert rc == 0, err
    meta = json.loads((out / "meta.json").read_text())
    assert meta["end_reason"] == "target-exit" and meta["children"]
    df = syscall_events(tracefmt.load(out))
    # the lab counts its workload's preadv2 calls; its start-up reads (the header) come before
    for k in kids:
        mine = df[(df["pid"] == k["pid"]) & (df["syscall"] == "preadv2")]
        assert len(mine) == k["calls"], (k["pid"], len(mine), k["calls"])
        # (no path check: a reader that exits before the next drain leaves no /proc/PID/fd to
        # resolve its fds from; the counts are the kernel's)


def _cgroup_dir(root: str, name: str) -> Path:
    if not os.path.isdir(root):
        pytest.skip(f"no cgroup hierarchy at {root}")
    d = Path(root) / f"engramprof-test-{name}-{os.getpid()}"
    d.mkdir()
    return d


def _remove_cgroup(d: Path) -> None:
    """Move any process left in it back to the hierarchy's root, then remove the directory."""
    try:
        left = (d / "cgroup.procs").read_text().split()
    except OSError:
        left = []
    for p in left:
        try:
            (d.parent / "cgroup.procs").write_text(p)
        except OSError:
            pass
    import time

    for _ in range(20):  # EBUSY while a task that was in it is still exiting: a leftover group
        try:             # named engramprof-* fails the next run's test_demo cleanup check
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


def _cgroup_two_in_one_out(tmp_path, table, root: str, name: str):
    cg = _cgroup_dir(root, name)
    procs = []
    try:
        inside = [start_reader(table), start_reader(table)]
        procs += inside
        for lab in inside:  # waiting for SIGUSR1: in the cgroup before the first read
            (cg / "cgroup.procs").write_text(str(lab.pid))
        outside = start_reader(table)
        procs.append(outside)
        tracer, out = trace_of(tmp_path, name, "--cgroup", str(cg))
        procs.append(tracer)
        for lab in (*inside, outside):
            os.kill(lab.pid, signal.SIGUSR1)
        labs = [finish_reader(lab) for lab in inside]
        finish_reader(outside)
        tracer.p.send_signal(signal.SIGINT)  # a cgroup selects whoever comes: it runs until told
        rc, _, err = tracer.finish()
        assert rc == 0, err
        meta = json.loads((out / "meta.json").read_text())
        assert meta["cgroups"] == [str(cg)]
        df = tracefmt.load(out)
        assert counts_by_pid(out) == {lab.pid: n["calls"] for lab, n in zip(inside, labs)}
        assert set(df["pid"]) <= {lab.pid for lab in inside}, set(df["pid"])  # calls and faults: none outside
    finally:
        for p in procs:
            if p.p.poll() is None:
                p.p.kill()
                p.p.wait()
        _remove_cgroup(cg)


@pytest.mark.bpf
def test_cgroup2_two_readers_inside_seen_whole_third_outside_not(tmp_path, table):
    _cgroup_two_in_one_out(tmp_path, table, "/sys/fs/cgroup/unified", "v2")


@pytest.mark.bpf
def test_cgroup_v1_two_readers_inside_seen_whole_third_outside_not(tmp_path, table):
    _cgroup_two_in_one_out(tmp_path, table, "/sys/fs/cgroup/memory", "v1")


# a reader of two files: preadv2 calls of each, counted by itself (its imports read with read(2))
TWO_FILES = r"""
import json, os, signal, sys
a, b, na, nb = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
fa, fb = os.open(a, os.O_RDONLY), os.open(b, os.O_RDONLY)
buf = bytearray(4096)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
print("two: ready", file=sys.stderr, flush=True)
signal.sigwait({signal.SIGUSR1})
if len(sys.argv) > 5:  # mmap: touch one byte every 256 KiB of both (a page fault each)
    import mmap
    ma, mb = mmap.mmap(fa, 0, prot=mmap.PROT_READ), mmap.mmap(fb, 0, prot=mmap.PROT_READ)
    for m, n in ((ma, na), (mb, nb)):
        m.madvise(mmap.MADV_RANDOM)
        for i in range(n):
            m[(i * 262144) % len(m)]
for i in range(max(na, nb)):
    if i < na:
        os.preadv(fa, [buf], (i * 4096) % (1 << 20))
    if i < nb:
        os.preadv(fb, [buf], (i * 4096) % (1 << 20))
print(json.dumps({"pid": os.getpid(), "a": na, "b": nb}), flush=True)
signal.sigwait({signal.SIGUSR1})  # alive until the trace is closed: its fds can be named
"""


def two_file_reader(a: Path, b: Path, na: int, nb: int, *mmap: str) -> Proc:
    p = Proc([engramprof()[0], "-c", TWO_FILES, str(a), str(b), str(na), str(nb), *mmap])
    p.wait_line("two: ready", timeout=240)
    return p


@pytest.fixture
def two_files(tmp_path) -> tuple[Path, Path]:
    a, b = tmp_path / "table_a.bin", tmp_path / "other_b.bin"
    for f in (a, b):
        f.write_bytes(os.urandom(1 << 22))
    return a, b


def _run_readers(readers: list[Proc]) -> list[dict]:
    """Start them; their counts once done (they then wait for _release_readers)."""
    for r in readers:
        os.kill(r.pid, signal.SIGUSR1)
    return [json.loads(r.p.stdout.readline()) for r in readers]


def _release_readers(readers: list[Proc]) -> None:
    for r in readers:
        os.kill(r.pid, signal.SIGUSR1)
        rc, _, se = r.finish()
        assert rc == 0, se


@pytest.mark.bpf
def test_file_sees_two_unrelated_readers_of_it_and_not_their_other_file(tmp_path, two_files):
    a, b = two_files
    readers = [two_file_reader(a, b, 300, 200, "mmap"), two_file_reader(a, b, 150, 400, "mmap")]
    try:
        tracer, out = trace_of(tmp_path, "file", "--file", str(a), "--duration", "60")
        counts = _run_readers(readers)
        tracer.p.send_signal(signal.SIGINT)  # --file selects whoever comes: it runs until told
        rc, _, err = tracer.finish()
        assert rc == 0, err
        _release_readers(readers)
    finally:
        for p in readers:
            if p.p.poll() is None:
                p.p.kill()
                p.p.wait()
    meta = json.loads((out / "meta.json").read_text())
    st = os.stat(a)
    assert [f["ino"] for f in meta["files"]] == [st.st_ino]
    df = syscall_events(tracefmt.load(out))
    # every preadv2 of table_a by either process, none of other_b (nor of anyone else)
    assert counts_by_pid(out) == {c["pid"]: c["a"] for c in counts}
    assert set(df["path"]) == {str(a)}, set(df["path"])
    # page faults (both mapped every 256 KiB of each file): of table_a by both, none of other_b
    faults = (ev := tracefmt.load(out))[ev["kind"] == "fault"]
    assert set(faults["pid"]) == {c["pid"] for c in counts}, faults["pid"].value_counts()
    assert set(faults["path"]) == {str(a)}, set(faults["path"])


@pytest.mark.bpf
def test_cgroup_and_file_combined_are_that_groups_reads_of_that_file(tmp_path, two_files):
    a, b = two_files
    cg = _cgroup_dir("/sys/fs/cgroup/unified", "file")
    readers = []
    try:
        readers += [two_file_reader(a, b, 250, 120), two_file_reader(a, b, 180, 90)]
        (cg / "cgroup.procs").write_text(str(readers[0].pid))  # waiting: inside before its first read
        tracer, out = trace_of(tmp_path, "cgfile", "--cgroup", str(cg), "--file", str(a))
        readers.append(tracer)
        inside, outside = _run_readers(readers[:2])
        tracer.p.send_signal(signal.SIGINT)
        rc, _, err = tracer.finish()
        assert rc == 0, err
        _release_readers(readers[:2])
        meta = json.loads((out / "meta.json").read_text())
        assert meta["cgroups"] == [str(cg)] and [f["path"] for f in meta["files"]] == [str(a)]
        df = tracefmt.load(out)
        # the inside reader's reads of table_a only: not its other_b, not the outside reader's table_a
        assert counts_by_pid(out) == {inside["pid"]: inside["a"]}
        assert set(df["pid"]) == {inside["pid"]} and set(syscall_events(df)["path"]) == {str(a)}
    finally:
        for p in readers:
            if p.p.poll() is None:
                p.p.kill()
                p.p.wait()
        _remove_cgroup(cg)


@pytest.mark.bpf
def test_two_rank_scenario_diagnose_children_names_the_faulty_rank_and_its_cause():
    """lab scenario residency --workers 2 --faulty-rank 1: `diagnose --pid PARENT --children`
    analyses each rank on its own (markers carry pid and rank): rank 1 residency, rank 0 healthy."""
    from engramprof.lab.scenarios import Scenario

    # the default table (132 MiB; the faulty rank reads its half); the faulty rank's reader is the
    # serial one, so that its time is the misses' and not also a 32-thread pool's on 2 loaded cores
    with Scenario("residency", workers=2, faulty_rank=1, duration=30, start_delay=240, reader="serial") as sc:
        assert set(sc.info["ranks"]) == {"0", "1"} and sc.info["faulty_rank"] == 1
        ranks = {int(r): p for r, p in sc.info["ranks"].items()}
        tracer = Proc(engramprof("diagnose", "--pid", sc.pid, "--children", "--duration", "8", "--json",
                                 "--markers", sc.markers_path))
        try:
            tracer.wait_line("Tracing", timeout=240)  # BCC compiles three probes: slow on a loaded machine
            os.kill(sc.pid, signal.SIGUSR1)  # the lab's parent passes it on: the ranks start
            rc, out, err = tracer.finish()
        finally:
            if tracer.p.poll() is None:
                tracer.p.kill()
                tracer.p.wait()
        sc.stop()
    assert rc == 0, (err, out[-2000:])
    d = json.loads(out)
    by_pid = {p["pid"]: p for p in d["processes"]}  # top level, as in batch-tail's JSON
    assert d["processes"] == d["batch_tail"]["processes"]
    assert set(by_pid) >= set(ranks.values()), (by_pid.keys(), ranks)
    assert by_pid[ranks[1]]["verdict"] == "residency", by_pid[ranks[1]]
    assert by_pid[ranks[0]]["verdict"] == "healthy", by_pid[ranks[0]]
    assert by_pid[ranks[1]]["batch_ms"]["p50"] > by_pid[ranks[0]]["batch_ms"]["p50"]
    assert d["verdict"] == "residency" and d["slowest_process"] == ranks[1]  # the slowest process's


def test_lab_run_rank_options_bad_input_one_line_exit_2(tmp_path, table):
    for args, words in ((("--rank-reader", "0:nowait"), "needs --workers"),
                        (("--workers", "2", "--rank-reader", "2:nowait"), "rank 2 does not exist"),
                        (("--workers", "2", "--rank-reader", "x"), "RANK:VALUE"),
                        (("--workers", "2", "--rank-cache", "1:lukewarm"), "warm or cold"),
                        (("--workers", "2", "--rank-join", f"1:{tmp_path}"), "cgroup.procs"),
                        (("--workers", "2", "--rank-table", f"1:{tmp_path}/none"), "--rank-table")):
        r = subprocess.run(engramprof("lab", "run", "--table", table, "--steps", "1", *args),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and words in r.stderr and r.stderr.strip().count("\n") == 0, (args, r.stderr)


def test_lab_run_workers_shards_and_markers(tmp_path, table):
    """--workers 2: two ranks (children of the lab's pid), each reading only its shard of the
    table, every marker line whole and carrying its rank's pid and rank."""
    from engramprof.tables import safetensors as layout

    markers = tmp_path / "m.jsonl"
    r = subprocess.run(engramprof("lab", "run", "--table", table, "--workers", "2", "--steps", "25", "--reader",
                                  "serial", "--warm", "--json", "--markers", markers),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    ranks = {x["rank"]: x for x in d["ranks"]}
    assert d["workers"] == 2 and set(ranks) == {0, 1} and d["steps"] == 50
    assert d["calls"] == sum(x["calls"] for x in ranks.values())
    lines = [json.loads(line) for line in markers.read_text().splitlines()]
    for k, x in ranks.items():
        mine = [m for m in lines if m["rank"] == k]
        assert len(mine) == 25 and {m["pid"] for m in mine} == {x["pid"]} and x["pid"] != d["pid"]
    # shard k of 2: every row read lies in [k * rows / 2, (k + 1) * rows / 2) of its tensor
    lay = layout.load(table)
    for k in (0, 1):
        reads = [rr for b in _planned_shard(table, k) for rr in b]
        for off, _size in reads:
            t = next(t for t in lay.tensors if t.start <= off < t.start + t.rows * t.row_bytes)
            row = (off - t.start) // t.row_bytes
            assert k * (t.rows // 2) <= row < (k + 1) * (t.rows // 2)


def _planned_shard(table: Path, k: int):
    from engramprof.tables import safetensors as layout
    from engramprof.lab import workload

    plan = workload.Plan(layout.load(table), 4, 6, 1.1, 0, shard=(k, 2))
    return [workload.batch_reads(b) for b in plan.batches(25)]


@pytest.mark.bpf
def test_children_alive_at_start_lab_workers_every_rank_seen_whole(tmp_path, table):
    """`lab run --workers 2` forks its ranks before tracing begins: `--pid LAB --children` puts
    them into every probe's map at start (a fork hook only sees later forks); each rank's
    preadv2 count equals its own."""
    lab = Proc(engramprof("lab", "run", "--table", table, "--json", "--start-delay", "120", "--reader", "serial",
                          "--steps", "8", "--tokens", "4", "--warm", "--workers", "2"))
    try:
        lab.wait_line("lab: ready", timeout=240)
        ranks = [int(line.split()[-1]) for line in lab.lines if line.startswith("lab: rank ")]
        tracer, out = trace_of(tmp_path, "ranks", "--pid", str(lab.pid), "--children", sample_hz="20")
        os.kill(lab.pid, signal.SIGUSR1)
        d = finish_reader(lab)
        rc, _, err = tracer.finish()  # ends by itself: every target has exited
        assert rc == 0, err
    finally:
        for p in (lab,):
            if p.p.poll() is None:
                p.p.kill()
                p.p.wait()
    assert sorted(x["pid"] for x in d["ranks"]) == sorted(ranks)
    df = syscall_events(tracefmt.load(out))
    for x in d["ranks"]:
        assert len(df[(df["pid"] == x["pid"]) & (df["syscall"] == "preadv2")]) == x["calls"], x["pid"]
    threads = tracefmt.load_bundle(out).samples("threads")
    assert set(ranks) <= set(threads["pid"])  # the samplers follow the ranks too


# Selection judged again on every call (targets.h's per-CPU memos, issue 13's overhead target):
# a reader driven line by line from stdin; each phase reads its own 1 MiB region of the file, so
# the trace's offsets tell the phases apart.
PHASED = r"""
import os, sys
paths = sys.argv[1:]
fds = {}
buf = bytearray(4096)
print("phased: ready", file=sys.stderr, flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "open":       # open NAME PATHINDEX: NAME = the lowest free fd, reported
        fds[cmd[1]] = os.open(paths[int(cmd[2])], os.O_RDONLY)
    elif cmd[0] == "close":
        os.close(fds.pop(cmd[1]))
    elif cmd[0] == "dup2":     # dup2 SRC DST: DST's fd number now names SRC's file
        os.dup2(fds[cmd[1]], fds[cmd[2]])
    elif cmd[0] == "read":     # read NAME PHASE N
        fd, phase, n = fds[cmd[1]], int(cmd[2]), int(cmd[3])
        for i in range(n):
            os.preadv(fd, [buf], (phase << 20) + (i % 256) * 4096)
    print(" ".join(str(fds.get(c, -1)) for c in cmd[1:2]), flush=True)
"""


class Phased:
    def __init__(self, *paths: Path):
        self.proc = Proc([engramprof()[0], "-c", PHASED, *map(str, paths)], stdin=subprocess.PIPE)
        self.proc.wait_line("phased: ready", timeout=240)

    def do(self, *cmd) -> int:
        """One command; the fd number it names afterwards."""
        self.proc.p.stdin.write(" ".join(map(str, cmd)) + "\n")
        self.proc.p.stdin.flush()
        return int(self.proc.p.stdout.readline())

    def close(self) -> None:
        if self.proc.p.poll() is None:
            self.proc.p.stdin.close()
            self.proc.p.wait(timeout=60)


def _phases(trace: Path, pid: int) -> dict[int, int]:
    df = syscall_events(tracefmt.load(trace))
    mine = df[df["pid"] == pid]
    return {int(k): int(v) for k, v in (mine["offset"] // (1 << 20)).value_counts().items()}


@pytest.mark.bpf
def test_cgroup2_process_moved_in_and_out_and_into_a_later_subgroup_judged_on_every_call(tmp_path, two_files):
    """Moved into the traced cgroup mid-trace: traced; moved into a sub-group made after the start:
    traced once the sub-group is seen (a 'not in' verdict memoized for it meanwhile is dropped when
    its id is added); moved back out: not traced.  Counts per phase exact."""
    a, _ = two_files
    cg = _cgroup_dir("/sys/fs/cgroup/unified", "move")
    sub = None
    r = Phased(a)
    tracer = None
    try:
        root_procs = Path("/sys/fs/cgroup/unified/cgroup.procs")
        tracer, out = trace_of(tmp_path, "move", "--cgroup", str(cg))
        r.do("open", "t", 0)
        r.do("read", "t", 1, 500)                   # outside: not traced
        (cg / "cgroup.procs").write_text(str(r.proc.pid))
        r.do("read", "t", 2, 700)                   # inside: every call
        sub = cg / "later"
        sub.mkdir()
        (sub / "cgroup.procs").write_text(str(r.proc.pid))
        r.do("read", "t", 3, 2000)                  # the sub-group, maybe not seen yet: not counted
        import time
        time.sleep(3)                               # the recorder walks the tree every second
        r.do("read", "t", 4, 600)                   # the sub-group, seen: every call
        root_procs.write_text(str(r.proc.pid))
        r.do("read", "t", 5, 400)                   # out again: none
        (cg / "cgroup.procs").write_text(str(r.proc.pid))
        r.do("read", "t", 6, 300)                   # and in again: every call
        time.sleep(1.5)                             # the last calls drained
        tracer.p.send_signal(signal.SIGINT)
        rc, _, err = tracer.finish()
        assert rc == 0, err
        got = _phases(out, r.proc.pid)
        assert {k: got.get(k, 0) for k in (1, 2, 4, 5, 6)} == {1: 0, 2: 700, 4: 600, 5: 0, 6: 300}, got
        assert got.get(3, 0) <= 2000
    finally:
        if tracer is not None and tracer.p.poll() is None:
            tracer.p.kill()
            tracer.p.wait()
        r.close()
        if sub is not None:
            _remove_cgroup(sub)
        _remove_cgroup(cg)


@pytest.mark.bpf
def test_file_fd_closed_reopened_as_another_file_and_dup2_back_judged_on_every_call(tmp_path, two_files):
    """--file: the fd of the target closed and the same number reopened on another file: not traced;
    the target dup2'ed over it: traced again; the target opened on a new fd: traced.  Exact counts
    per phase, the other file never."""
    a, b = two_files
    r = Phased(a, b)
    tracer = None
    try:
        tracer, out = trace_of(tmp_path, "fdreuse", "--file", str(a))
        n = r.do("open", "x", 0)
        r.do("read", "x", 1, 400)                   # the target: every call
        r.do("close", "x")
        assert r.do("open", "x", 1) == n            # the same fd number, now the other file
        r.do("read", "x", 2, 500)                   # none
        r.do("open", "y", 0)
        r.do("dup2", "y", "x")                      # fd n names the target again
        r.do("read", "x", 3, 300)                   # every call
        r.do("close", "y")
        r.do("open", "z", 1)                        # the other file on the freed number
        r.do("read", "z", 4, 200)                   # none
        r.do("read", "x", 5, 100)                   # the target through fd n still: every call
        import time
        time.sleep(1.5)
        tracer.p.send_signal(signal.SIGINT)
        rc, _, err = tracer.finish()
        assert rc == 0, err
        got = _phases(out, r.proc.pid)
        assert {k: got.get(k, 0) for k in range(1, 6)} == {1: 400, 2: 0, 3: 300, 4: 0, 5: 100}, got
        # (no path check: user space names an fd from /proc at drain time, and this fd number
        # named both files within one drain; the counts are the kernel's)
    finally:
        if tracer is not None and tracer.p.poll() is None:
            tracer.p.kill()
            tracer.p.wait()
        r.close()


def _cgroup_mode(*dirs: Path) -> str:
    """How targets.h matches these --cgroup directories: 'slots' (ancestor id constants) or 'hash'."""
    from engramprof.bpf import targets
    from engramprof.target.selection import Selection

    return "slots" if targets.cgroup_slots(Selection.parse(cgroups=[str(d) for d in dirs])) else "hash"


@pytest.mark.bpf
def test_cgroup2_subgroups_made_during_the_trace_are_traced_from_their_first_call(tmp_path, two_files):
    """--cgroup A --cgroup B as (level, id) constants (bpf_get_current_ancestor_cgroup_id): a process
    moved into a sub-group of A made after the start, then a sub-group of that, is traced from its
    first call there (nothing to sync from user space); into B: traced; back to the root: not.
    Exact counts per phase."""
    a, _ = two_files
    cg, other = _cgroup_dir("/sys/fs/cgroup/unified", "slotsA"), _cgroup_dir("/sys/fs/cgroup/unified", "slotsB")
    made: list[Path] = []
    r = Phased(a)
    tracer = None
    try:
        if _cgroup_mode(cg, other) != "slots":
            pytest.skip("the cgroup levels are not known here (a cgroup namespace): the hash is used")
        root_procs = Path("/sys/fs/cgroup/unified/cgroup.procs")
        tracer, out = trace_of(tmp_path, "slots", "--cgroup", str(cg), "--cgroup", str(other))
        r.do("open", "t", 0)
        r.do("read", "t", 1, 300)                   # outside: not traced
        sub = cg / "later"
        sub.mkdir()
        made.append(sub)
        (sub / "cgroup.procs").write_text(str(r.proc.pid))
        r.do("read", "t", 2, 700)                   # a sub-group made just now: every call
        deeper = sub / "deeper"
        deeper.mkdir()
        made.append(deeper)
        (deeper / "cgroup.procs").write_text(str(r.proc.pid))
        r.do("read", "t", 3, 500)                   # two levels below A: every call
        (other / "cgroup.procs").write_text(str(r.proc.pid))
        r.do("read", "t", 4, 400)                   # the other --cgroup: every call
        root_procs.write_text(str(r.proc.pid))
        r.do("read", "t", 5, 200)                   # out: none
        import time
        time.sleep(1.5)                             # the last calls drained
        tracer.p.send_signal(signal.SIGINT)
        rc, _, err = tracer.finish()
        assert rc == 0, err
        got = _phases(out, r.proc.pid)
        assert {k: got.get(k, 0) for k in range(1, 6)} == {1: 0, 2: 700, 3: 500, 4: 400, 5: 0}, got
    finally:
        if tracer is not None and tracer.p.poll() is None:
            tracer.p.kill()
            tracer.p.wait()
        r.close()
        for d in reversed(made):
            _remove_cgroup(d)
        _remove_cgroup(other)
        _remove_cgroup(cg)


@pytest.mark.bpf
def test_cgroup2_more_directories_than_slots_are_matched_by_the_hash(tmp_path, two_files):
    """Nine --cgroup directories (one more than targets.h's constant slots): the id hash
    (bpf_get_current_cgroup_id, synced every second) judges them; a process moved into one of them
    and into a sub-group of it that existed at the start is traced, outside it is not."""
    a, _ = two_files
    dirs = [_cgroup_dir("/sys/fs/cgroup/unified", f"hash{i}") for i in range(9)]
    sub = dirs[4] / "sub"
    sub.mkdir()
    r = Phased(a)
    tracer = None
    try:
        assert _cgroup_mode(*dirs) == "hash"
        tracer, out = trace_of(tmp_path, "hash", *(x for d in dirs for x in ("--cgroup", str(d))))
        r.do("open", "t", 0)
        r.do("read", "t", 1, 300)                   # outside: none
        (dirs[4] / "cgroup.procs").write_text(str(r.proc.pid))
        r.do("read", "t", 2, 600)                   # inside: every call
        (sub / "cgroup.procs").write_text(str(r.proc.pid))
        r.do("read", "t", 3, 400)                   # its sub-group: every call
        Path("/sys/fs/cgroup/unified/cgroup.procs").write_text(str(r.proc.pid))
        r.do("read", "t", 4, 200)                   # out: none
        import time
        time.sleep(1.5)
        tracer.p.send_signal(signal.SIGINT)
        rc, _, err = tracer.finish()
        assert rc == 0, err
        got = _phases(out, r.proc.pid)
        assert {k: got.get(k, 0) for k in range(1, 5)} == {1: 0, 2: 600, 3: 400, 4: 0}, got
    finally:
        if tracer is not None and tracer.p.poll() is None:
            tracer.p.kill()
            tracer.p.wait()
        r.close()
        _remove_cgroup(sub)
        for d in dirs:
            _remove_cgroup(d)


@pytest.mark.bpf
def test_file_alone_never_records_the_tracers_own_reads_of_the_file(tmp_path, two_files):
    """--file T selects every process's reads of T but the tracer's own: once it sees T read it
    reads T's first MiB (O_DIRECT, the file's identity) with preadv while tracing (targets.h
    TRACER_TGID).  The reader's calls are all there, the tracer's none."""
    a, b = two_files
    r = two_file_reader(a, b, 300, 100)
    tracer = None
    try:
        tracer, out = trace_of(tmp_path, "own", "--file", str(a))
        (did,) = _run_readers([r])
        import time
        time.sleep(2.5)                             # drained, the fd named, T identified meanwhile
        tracer.p.send_signal(signal.SIGINT)
        rc, _, err = tracer.finish()
        assert rc == 0, err
        _release_readers([r])
        files = tracefmt.load_bundle(out).table("files")
        assert files is not None, "the tracer identified no file"
        row = files[files["path"] == str(a)]
        # the tracer did read T (preadv or pread64: O_DIRECT, or the cached pages) while its
        # probes were attached (non-vacuity)
        assert len(row) == 1 and row["method"].iloc[0] in ("O_DIRECT", "resident pages"), row
        assert row["head_sha256"].iloc[0], row
        assert counts_by_pid(out) == {did["pid"]: did["a"]}
        assert tracer.pid not in set(tracefmt.load(out)["pid"])
    finally:
        for p in (r, tracer):
            if p is not None and p.p.poll() is None:
                p.p.kill()
                p.p.wait()
