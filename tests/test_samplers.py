"""Samplers (issue 4, no eBPF): real /proc and cgroup v1 on this machine, fake trees for the
failure modes.  Kept short: the machine is shared, so system-wide figures get loose bounds and
the precise assertions are made on per-cgroup / per-process counters that neighbours can't move.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engramprof.sampling import sampler as samplers
from engramprof.errors import UserError
from engramprof.sampling.sampler import SAMPLE_NAMES, Sampler, summarize, summarize_bundle
from engramprof.trace import TraceWriter, load_bundle

REPO = Path(__file__).resolve().parents[1]
MEMCG_ROOT = Path("/sys/fs/cgroup/memory")
UNIFIED_ROOT = Path("/sys/fs/cgroup/unified")
MiB = 1 << 20


# ------------------------------------------------------------------------------- helpers


def _child(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    )


def _say(p: subprocess.Popen, line: str) -> None:
    p.stdin.write(line + "\n")
    p.stdin.flush()


def _expect(p: subprocess.Popen, want: str) -> str:
    line = p.stdout.readline().strip()
    assert line.startswith(want), f"child said {line!r}, wanted {want!r}"
    return line


def _stop_child(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
    p.wait(timeout=10)
    for f in (p.stdin, p.stdout):
        try:
            f.close()
        except OSError:
            pass


def _make_file(path: Path, size: int, evict: bool) -> Path:
    chunk = os.urandom(MiB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(size // MiB):
            os.write(fd, chunk)
        if evict:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return path


def _cgroups_usable() -> bool:
    return os.geteuid() == 0 and (MEMCG_ROOT / "cgroup.procs").exists() and os.access(MEMCG_ROOT, os.W_OK)


needs_memcg_v1 = pytest.mark.skipif(not _cgroups_usable(), reason="needs root and a writable cgroup v1 memory controller")


class MemGroups:
    """A v1 memory group (and, on a hybrid, a unified-hierarchy group for per-group PSI)."""

    def __init__(self, limit: int | None):
        name = f"engramprof-test-{os.getpid()}-{time.monotonic_ns() % 10**6}"
        self.dirs: list[Path] = []
        self.mem = MEMCG_ROOT / name
        os.mkdir(self.mem)
        self.dirs.append(self.mem)
        if limit is not None:
            (self.mem / "memory.limit_in_bytes").write_text(str(limit))
        self.v2 = None
        if (UNIFIED_ROOT / "cgroup.procs").exists():
            try:
                os.mkdir(UNIFIED_ROOT / name)
                self.v2 = UNIFIED_ROOT / name
                self.dirs.append(self.v2)
            except OSError:
                pass

    def add(self, pid: int) -> None:
        for d in self.dirs:
            (d / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        """Move anything left out to the parent group, then rmdir (retrying while tasks exit)."""
        for d in reversed(self.dirs):
            for _ in range(50):
                try:
                    for pid in (d / "cgroup.procs").read_text().split():
                        try:
                            (d.parent / "cgroup.procs").write_text(pid)
                        except OSError:
                            pass
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
        left = [str(d) for d in self.dirs if d.exists()]
        assert not left, f"could not remove test cgroups {left}"


READER = """
import os, random, sys, time
path, secs = sys.argv[1], float(sys.argv[2])
fd = os.open(path, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
pages = os.fstat(fd).st_size // 4096
print("ready", flush=True)
sys.stdin.readline()
n, end = 0, time.monotonic() + secs
while time.monotonic() < end:
    os.pread(fd, 4096, random.randrange(pages) * 4096)
    n += 1
print("done", n, flush=True)
sys.stdin.readline()
"""


def _sample_reader(tmp_path: Path, file_mib: int, limit: int | None, evict: bool, secs: float):
    data = _make_file(tmp_path / "table.bin", file_mib * MiB, evict=evict)
    groups = MemGroups(limit)
    child = None
    try:
        child = _child(READER, str(data), str(secs))
        _expect(child, "ready")
        groups.add(child.pid)
        sampler = Sampler(pid=child.pid, hz=10)
        sampler.start()
        time.sleep(0.25)
        _say(child, "go")
        reads = int(_expect(child, "done").split()[1])
        time.sleep(0.15)
        sampler.stop()
        return sampler.summary(), groups, reads
    finally:
        if child is not None:
            _stop_child(child)
        groups.remove()


# ------------------------------------------------------------------------- real machine


def test_quiet_self_cached_reads_and_bundle_roundtrip(tmp_path, monkeypatch):
    """Cached reads on a quiet machine: no storage reads, no faults; PSI memory ~0 (loose:
    shared machine).  Also: flushed parts in a TRACE give the same summary as the live one."""
    data = _make_file(tmp_path / "hot.bin", 4 * MiB, evict=False)
    fd = os.open(data, os.O_RDONLY)
    for off in range(0, 4 * MiB, 65536):  # make sure it is all cached
        os.pread(fd, 65536, off)
    monkeypatch.setattr(samplers, "FLUSH_MAX_S", 0.2)  # small series go out at every flush too
    w = TraceWriter(tmp_path / "trace")
    s = Sampler(pid=os.getpid(), hz=20, flush_s=0.3)
    s.start(w)
    end = time.monotonic() + 1.0
    n = 0
    while time.monotonic() < end:
        os.pread(fd, 4096, (n * 7919 % 1024) * 4096)
        n += 1
    s.stop()
    w.close()
    os.close(fd)
    live = s.summary()
    assert live["window"]["samples"] >= 15
    assert 0.8 < live["window"]["duration_s"] < 2.0
    pr = live["process"]
    # all hits in the page cache (this process may lazily load a library or two meanwhile)
    assert pr["rchar"] >= 0.5 * n * 4096  # reads before the first round are not in the window
    assert pr["read_bytes"] < 0.01 * pr["rchar"] and pr["majflt"] < 100, pr
    assert pr["syscr"] >= 0.5 * n
    psi = live["psi"]
    assert set(psi) == {"cpu", "memory", "io"}
    assert psi["memory"]["some_pct"] < 10  # ~0 on a quiet machine; neighbours may add a little
    vm = live["vmstat"]
    for k in ("workingset_refault_file", "pgscan_kswapd", "pgscan_direct", "allocstall", "pgscan_memcg", "pgmajfault", "pgpgin"):
        assert k in vm and vm[k] >= 0
    assert vm["pgscan_direct"] < 50_000 and vm["allocstall"] < 1000
    assert live["kswapd"]["threads"] and live["kswapd"]["cpu_pct"] < 50
    # several flushed parts per series, readable back into the same summary
    parts = sorted((tmp_path / "trace" / "samples" / "vmstat").glob("part-*.parquet"))
    assert len(parts) >= 2
    tr = load_bundle(tmp_path / "trace")
    assert set(tr.sample_names) == set(SAMPLE_NAMES)
    assert tr.meta["sampler"]["pid"] == os.getpid()
    again = summarize_bundle(tmp_path / "trace")
    assert again["vmstat"] == live["vmstat"]
    assert again["psi"] == live["psi"]
    assert again["process"]["ctx_voluntary"] == pr["ctx_voluntary"]
    th = tr.samples("threads")
    assert {"ts_ns", "tid", "name", "ctx_voluntary", "ctx_involuntary", "ctx_voluntary_delta", "utime_s", "stime_s"} <= set(th.columns)
    assert th["ts_ns"].is_monotonic_increasing
    assert abs(int(th["ts_ns"].iloc[-1]) - time.monotonic_ns()) < 10e9  # CLOCK_MONOTONIC
    assert s.status_line().startswith("PSI some/full mem")


@needs_memcg_v1
def test_cgroup_quiet_cached_reader(tmp_path):
    """A reader of a cached file in its own unlimited memory group: the group shows no
    refaults, no limit hits and no memory pressure (neighbours cannot move these)."""
    s, groups, reads = _sample_reader(tmp_path, 8, limit=None, evict=False, secs=1.0)
    cg = s["cgroup"]
    assert cg["v1_memory"] == str(groups.mem)
    assert cg["limited"] is False
    assert cg["refault_file"] == 0
    assert cg["failcnt"] == 0
    if groups.v2 is not None:
        assert cg["version"] == "hybrid" and cg["v2"] == str(groups.v2)
        assert cg["pressure"]["memory"]["some_us"] <= 1000
    assert s["process"]["read_bytes"] == 0 and s["process"]["majflt"] == 0
    assert reads > 1000


@needs_memcg_v1
def test_cgroup_v1_limit_below_working_set_shows_reclaim(tmp_path):
    """64 MiB random reads under a 16 MiB memory.limit_in_bytes: cgroup refaults, limit hits,
    cgroup-limit reclaim in vmstat, memory PSI rising (system-wide and for the group)."""
    s, groups, reads = _sample_reader(tmp_path, 64, limit=16 * MiB, evict=True, secs=2.0)
    cg = s["cgroup"]
    assert cg["v1_memory"] == str(groups.mem)
    assert cg["limited"] and cg["limit_bytes"] == 16 * MiB
    assert cg["usage_max_bytes"] <= 16 * MiB
    assert cg["refault_file"] > 0, cg
    assert cg["failcnt"] > 0 and cg["pgpgout"] > 0, cg  # v1 has no pgscan/pgsteal in memory.stat
    assert s["vmstat"]["pgscan_memcg"] > 0 and s["vmstat"]["pgsteal_memcg"] > 0
    assert s["vmstat"]["workingset_refault_file"] >= cg["refault_file"] * 0.5
    assert s["psi"]["memory"]["some_us"] > 0
    if groups.v2 is not None:
        assert cg["pressure"]["memory"]["some_us"] > 0
        assert cg["pressure"]["io"]["some_us"] > 0
    assert s["process"]["read_bytes"] > 0
    assert any("cgroup is reclaiming" in line for line in s["interpretation"]), s["interpretation"]
    assert reads > 100


POOL = """
import os, sys
from concurrent.futures import ThreadPoolExecutor
fd = os.open(sys.argv[1], os.O_RDONLY)
pool = ThreadPoolExecutor(16)
read = lambda i: os.pread(fd, 4096, (i % 16) * 4096)
list(pool.map(read, range(256)))
print("ready", flush=True)
for line in sys.stdin:
    for _ in range(int(line)):
        list(pool.map(read, range(32)))
    print("done", flush=True)
"""


def test_thread_pool_context_switches_rise_with_batches(tmp_path):
    data = _make_file(tmp_path / "rows.bin", 1 * MiB, evict=False)
    child = _child(POOL, str(data))
    try:
        _expect(child, "ready")
        pool_cs = {}
        for batches in (10, 300):
            s = Sampler(pid=child.pid, hz=20)
            s.start()
            time.sleep(0.1)
            _say(child, str(batches))
            _expect(child, "done")
            time.sleep(0.1)
            s.stop()
            summ = s.summary()
            threads = [t for t in summ["process"]["threads"] if t["tid"] != child.pid]
            assert len(threads) >= 16
            pool_cs[batches] = sum(t["ctx_voluntary"] + t["ctx_involuntary"] for t in threads)
            th = s.frames()["threads"]
            assert th["tid"].nunique() == summ["process"]["threads_seen"] >= 17
            assert (th["name"] != "").all()
            # cumulative and delta columns agree per thread
            for tid, g in th.groupby("tid"):
                assert g["ctx_voluntary"].iloc[-1] - g["ctx_voluntary"].iloc[0] == g["ctx_voluntary_delta"].iloc[1:].sum()
        assert pool_cs[300] >= 300, pool_cs  # at least one wakeup per batch
        assert pool_cs[300] > 3 * pool_cs[10], pool_cs
    finally:
        _stop_child(child)


def test_pid_exits_mid_sample_keeps_data():
    child = subprocess.Popen(["sleep", "0.5"])
    try:
        s = Sampler(pid=child.pid, hz=20)
        s.start()
        assert s.target_exited.wait(5)  # zombie (not yet reaped) counts as exited
        time.sleep(0.2)
        s.stop()
    finally:
        child.wait()
    summ = s.summary()
    pr = summ["process"]
    assert pr["exited"] and pr["samples"] >= 3 and 0.2 < pr["exited_after_s"] < 3
    assert any("exited" in n and "kept" in n for n in summ["notes"])
    assert summ["window"]["duration_s"] > pr["exited_after_s"]  # system sampling went on
    assert len(s.frames()["threads"]) >= 3


def test_nonexistent_pid_is_a_user_error():
    with pytest.raises(UserError, match="no process with pid"):
        Sampler(pid=2**22 + 12345)


# --------------------------------------------------------------------------- the command


def _cli(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "engramprof", *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_cli_json_ends_when_pid_exits():
    child = subprocess.Popen(["sleep", "4"])  # the CLI starts within it even on a loaded machine
    try:
        p = _cli("sample", "--pid", str(child.pid), "--json", "--duration", "20")
        out, err = p.communicate(timeout=30)
    finally:
        child.wait()
    assert p.returncode == 0, err
    assert err.startswith("Sampling pid")
    s = json.loads(out)
    assert set(s["psi"]) == {"cpu", "memory", "io"} and "some_us" in s["psi"]["memory"] and "full_us" in s["psi"]["io"]
    for k in ("workingset_refault_file", "pgscan_kswapd", "pgscan_direct", "allocstall"):
        assert k in s["vmstat"]
    assert s["cgroup"]["version"] in ("v1", "v2", "hybrid")
    assert s["process"]["exited"] is True and s["end_reason"] == "target-exit"
    assert isinstance(s["notes"], list) and s["window"]["duration_s"] < 10


def test_cli_nonexistent_pid_exit_2():
    p = _cli("sample", "--pid", str(2**22 + 12345), "--duration", "1")
    out, err = p.communicate(timeout=30)
    assert p.returncode == 2
    assert err.strip().splitlines() == [f"engramprof: no process with pid {2**22 + 12345}"]
    assert out == ""


def test_cli_sigterm_ends_cleanly_with_trace(tmp_path):
    p = _cli("sample", "--json", "--output", str(tmp_path / "t"))
    assert p.stderr.readline().startswith("Sampling at 10 Hz")
    time.sleep(0.8)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    s = json.loads(out)
    assert s["end_reason"] == "signal" and s["window"]["samples"] >= 5
    assert any(n.startswith("ended by SIGTERM") for n in s["notes"]), s["notes"]
    assert "process" not in s and "cgroup" not in s  # no --pid
    tr = load_bundle(tmp_path / "t")
    assert tr.meta["complete"] and tr.meta["sampler"]["hz"] == 10
    assert summarize_bundle(tmp_path / "t")["vmstat"] == s["vmstat"]


# ------------------------------------------------------------------ fake /proc and /sys


def _stat_line(pid: int, comm: str, state="S", utime=0, stime=0, minflt=0, majflt=0, threads=1, starttime=777, rss=100) -> str:
    f = ["0"] * 50
    f[0], f[7], f[9], f[11], f[12], f[17], f[19], f[21] = state, str(minflt), str(majflt), str(utime), str(stime), str(threads), str(starttime), str(rss)
    return f"{pid} ({comm}) " + " ".join(f) + "\n"


def _vmstat(**kw) -> str:
    base = {
        "nr_free_pages": 1000,
        "workingset_refault_file": 10,
        "workingset_activate_file": 0,
        "workingset_restore_file": 0,
        "pgpgin": 100,
        "pgmajfault": 0,
        "pgscan_kswapd": 0,
        "pgsteal_kswapd": 0,
        "pgscan_direct": 0,
        "pgsteal_direct": 0,
        "pgscan_anon": 0,
        "pgscan_file": 0,
        "pgsteal_anon": 0,
        "pgsteal_file": 0,
        "allocstall_normal": 0,
        "allocstall_movable": 0,
    }
    base.update(kw)
    return "".join(f"{k} {v}\n" for k, v in base.items())


def _psi(some: int, full: int) -> str:
    return f"some avg10=0.00 avg60=0.00 avg300=0.00 total={some}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total={full}\n"


class FakeTree:
    def __init__(self, root: Path, psi=True, pid: int | None = 4242, cgroup="hybrid"):
        self.proc, self.sys = root / "proc", root / "sys"
        self.proc.mkdir(parents=True)
        (self.proc / "vmstat").write_text(_vmstat())
        if psi:
            (self.proc / "pressure").mkdir()
            for r in ("cpu", "memory", "io"):
                (self.proc / "pressure" / r).write_text(_psi(0, 0))
        k = self.proc / "45"
        k.mkdir()
        (k / "comm").write_text("kswapd0\n")
        (k / "stat").write_text(_stat_line(45, "kswapd0"))
        self.pid = pid
        cg = self.sys / "fs" / "cgroup"
        cg.mkdir(parents=True)
        if pid is not None:
            p = self.proc / str(pid)
            (p / "task" / str(pid)).mkdir(parents=True)
            self.set_proc(utime=0, vcs=0)
            (p / "comm").write_text("reader\n")
            (p / "io").write_text("rchar: 0\nwchar: 0\nsyscr: 0\nsyscw: 0\nread_bytes: 0\nwrite_bytes: 0\n")
            if cgroup == "hybrid":
                (p / "cgroup").write_text("4:memory:/grp\n0::/grp\n")
                self.v1 = cg / "memory" / "grp"
                self.v1.mkdir(parents=True)
                (self.v1 / "memory.usage_in_bytes").write_text(str(8 * MiB))
                (self.v1 / "memory.limit_in_bytes").write_text(str(16 * MiB))
                (self.v1 / "memory.failcnt").write_text("0\n")
                self.set_v1(refault=5, pgpgout=0)
                (cg / "unified").mkdir()
                (cg / "unified" / "cgroup.controllers").write_text("hugetlb\n")
                self.v2 = cg / "unified" / "grp"
                self.v2.mkdir()
                self.set_v2_pressure(0, 0)
            elif cgroup == "v2":
                (p / "cgroup").write_text("0::/grp\n")
                (cg / "cgroup.controllers").write_text("cpu io memory pids\n")
                self.v2 = cg / "grp"
                self.v2.mkdir()
                (self.v2 / "memory.current").write_text(str(20 * MiB))
                (self.v2 / "memory.max").write_text("max\n")
                self.set_v2(refault=0, pgscan=0, events_max=0)
                self.set_v2_pressure(0, 0)

    def set_proc(self, utime: int, vcs: int):
        p = self.proc / str(self.pid)
        (p / "stat").write_text(_stat_line(self.pid, "reader", utime=utime))
        (p / "task" / str(self.pid) / "stat").write_text(_stat_line(self.pid, "reader", utime=utime))
        (p / "task" / str(self.pid) / "status").write_text(
            f"Name:\treader\nState:\tS (sleeping)\nvoluntary_ctxt_switches:\t{vcs}\nnonvoluntary_ctxt_switches:\t{vcs // 10}\n"
        )

    def set_v1(self, refault: int, pgpgout: int, failcnt: int = 0):
        (self.v1 / "memory.stat").write_text(
            f"cache 100\nrss 100\nworkingset_refault_file {refault}\npgpgin 0\npgpgout {pgpgout}\npgmajfault 0\n"
            f"hierarchical_memory_limit {16 * MiB}\ntotal_workingset_refault_file {refault}\ntotal_pgpgin 0\ntotal_pgpgout {pgpgout}\ntotal_pgmajfault 0\n"
        )
        (self.v1 / "memory.failcnt").write_text(f"{failcnt}\n")

    def set_v2(self, refault: int, pgscan: int, events_max: int):
        (self.v2 / "memory.stat").write_text(
            f"anon 100\nfile 100\npgmajfault 0\nworkingset_refault_anon 0\nworkingset_refault_file {refault}\n"
            f"workingset_activate_file 0\nworkingset_restore_file 0\npgscan {pgscan}\npgsteal {pgscan // 2}\n"
        )
        (self.v2 / "memory.events").write_text(f"low 0\nhigh 0\nmax {events_max}\noom 0\noom_kill 0\n")

    def set_v2_pressure(self, mem_some: int, io_some: int):
        (self.v2 / "memory.pressure").write_text(_psi(mem_some, mem_some // 2))
        (self.v2 / "io.pressure").write_text(_psi(io_some, 0))

    def sampler(self, **kw) -> Sampler:
        ticks = iter(range(10**9, 10**12, 10**8))  # 100 ms apart
        return Sampler(pid=self.pid, proc_root=str(self.proc), sys_root=str(self.sys), clock=lambda: next(ticks), **kw)


def test_missing_psi_is_a_note_not_a_traceback(tmp_path):
    t = FakeTree(tmp_path, psi=False, pid=None)
    s = t.sampler()
    s.sample_now()
    (t.proc / "vmstat").write_text(_vmstat(workingset_refault_file=40, pgscan_file=700, pgscan_kswapd=200, pgscan_direct=100, allocstall_normal=2, allocstall_movable=1))
    (t.proc / "45" / "stat").write_text(_stat_line(45, "kswapd0", utime=3, stime=2))
    s.sample_now()
    s.sample_now()
    summ = s.summary()
    assert summ["psi"] == {}
    assert any("PSI not available" in n for n in summ["notes"])
    vm = summ["vmstat"]
    assert vm["workingset_refault_file"] == 30
    assert vm["allocstall"] == 3
    assert vm["pgscan_memcg"] == 400  # 700 scanned in all, 300 of it by kswapd/direct
    assert vm["pgscan_khugepaged"] is None  # absent on this "kernel": empty, not 0
    assert summ["kswapd"]["threads"][0]["cpu_s"] == pytest.approx(5 / os.sysconf("SC_CLK_TCK"))
    assert summ["window"]["duration_s"] == pytest.approx(0.2)
    assert "process" not in summ and "cgroup" not in summ
    assert s.status_line().startswith("PSI n/a")


def test_disappearing_cgroup_file_and_exiting_fake_pid(tmp_path):
    t = FakeTree(tmp_path, cgroup="hybrid")
    s = t.sampler()
    assert s.cgroup.version == "hybrid"
    s.sample_now()
    t.set_v1(refault=25, pgpgout=300, failcnt=7)
    t.set_v2_pressure(mem_some=5000, io_some=100)
    t.set_proc(utime=10, vcs=50)
    s.sample_now()
    (t.v1 / "memory.stat").unlink()
    (t.v2 / "memory.pressure").unlink()
    s.sample_now()
    import shutil

    shutil.rmtree(t.proc / "4242")  # the process exits
    s.sample_now()
    summ = s.summary()
    cg = summ["cgroup"]
    assert cg["refault_file"] == 20 and cg["pgpgout"] == 300 and cg["failcnt"] == 7
    assert cg["pressure"]["memory"]["some_us"] == 5000 and cg["pressure"]["io"]["some_us"] == 100
    assert cg["limit_bytes"] == 16 * MiB
    assert any("memory.stat disappeared" in n for n in summ["notes"])
    assert any("memory.pressure disappeared" in n for n in summ["notes"])
    pr = summ["process"]
    assert pr["exited"] and pr["samples"] == 3 and pr["ctx_voluntary"] == 50
    assert pr["cpu_user_s"] == pytest.approx(10 / os.sysconf("SC_CLK_TCK"))
    assert s.frames()["cgroup"]["refault_file"].isna().sum() == 2  # rounds 3 and 4


def test_cgroup_v2_counters_and_pressure(tmp_path):
    t = FakeTree(tmp_path, cgroup="v2")
    s = t.sampler()
    assert s.cgroup.version == "v2" and s.cgroup.v2_has_memory
    s.sample_now()
    t.set_v2(refault=100, pgscan=1000, events_max=4)
    t.set_v2_pressure(mem_some=20000, io_some=3000)
    s.sample_now()
    cg = s.summary()["cgroup"]
    assert (cg["refault_file"], cg["pgscan"], cg["pgsteal"], cg["events_max"]) == (100, 1000, 500, 4)
    assert cg["limited"] is False and cg["usage_bytes"] == 20 * MiB
    assert cg["pressure"]["memory"] == {"some_us": 20000, "full_us": 10000, "some_pct": 20.0, "full_pct": 10.0}
    assert cg["failcnt"] is None


def test_summarize_is_pure_on_empty_frames():
    s = summarize({n: None for n in SAMPLE_NAMES}, {})
    assert s["psi"] == {} and s["vmstat"] == {} and s["window"]["samples"] == 0
    assert s["interpretation"] == ["window too short to interpret"]


def test_follow_samples_every_traced_process_each_under_its_pid(tmp_path):
    """Sampler(follow=...): the other traced processes get process and thread rows too (issue
    13), a process that joins later from its join on, one that exits is noted."""
    data = _make_file(tmp_path / "rows.bin", 1 * MiB, evict=False)
    a, b, late = (_child(POOL, str(data)) for _ in range(3))
    try:
        for c in (a, b, late):
            _expect(c, "ready")
        traced = {b.pid}
        s = Sampler(pid=a.pid, hz=20, follow=lambda: set(traced), follow_s=0.2)
        s.start()
        time.sleep(0.3)
        _say(b, "300")
        _expect(b, "done")
        traced.add(late.pid)
        time.sleep(0.5)  # more than follow_s: picked up
        _say(late, "200")
        _expect(late, "done")
        _say(a, "5")
        _expect(a, "done")
        _stop_child(b)  # exits while followed
        time.sleep(0.3)
        s.stop()
        summ = s.summary()
    finally:
        for c in (a, b, late):
            _stop_child(c)
    th = s.frames()["threads"]
    cs = th.assign(cs=th["ctx_voluntary_delta"] + th["ctx_involuntary_delta"]).groupby("pid")["cs"].sum()
    assert set(cs.index) == {a.pid, b.pid, late.pid}
    assert cs[b.pid] >= 300 and cs[late.pid] >= 200 and cs[b.pid] > 3 * cs[a.pid], cs.to_dict()
    # each process's threads are its own (the pid column tells them apart)
    tids = {pid: set(g["tid"]) for pid, g in th.groupby("pid")}
    assert all(pid in t for pid, t in tids.items())  # its main thread
    assert not (tids[a.pid] & tids[b.pid] or tids[a.pid] & tids[late.pid] or tids[b.pid] & tids[late.pid])
    assert th.loc[th["pid"] == late.pid, "ts_ns"].min() > th.loc[th["pid"] == b.pid, "ts_ns"].min()
    procs = {p["pid"]: p for p in summ["processes"]}
    assert set(procs) == {a.pid, b.pid, late.pid} and summ["process"]["pid"] == a.pid
    assert procs[b.pid]["ctx_voluntary"] + procs[b.pid]["ctx_involuntary"] == cs[b.pid]
    assert summ["process"]["threads_seen"] == th.loc[th["pid"] == a.pid, "tid"].nunique()
    assert any(f"pid {b.pid} exited" in n for n in summ["notes"]), summ["notes"]
    assert s.info()["followed"] == {str(b.pid): procs[b.pid]["name"], str(late.pid): procs[late.pid]["name"]}


EXEC_ON_LINE = """
import os, sys
print("ready", flush=True)
sys.stdin.readline()
os.execvp("sleep", ["sleep", "30"])
"""


def test_the_sampler_says_which_processes_run_cpython_again_after_an_exec():
    """info()['cpython']: per process sampled, whether it runs a CPython interpreter (its
    executable mappings), kept after it exits, and read again when the process execs (a fork
    read before it execs another program: thread kinds would take its threads for Python)."""
    native = subprocess.Popen(["sleep", "30"])
    py = subprocess.Popen([sys.executable, "-c", EXEC_ON_LINE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True)
    try:
        assert py.stdout.readline().strip() == "ready"
        s = Sampler(pid=native.pid, hz=20, follow=lambda: {py.pid}, follow_s=0.1)
        s.start()
        try:
            deadline = time.monotonic() + 10
            while str(py.pid) not in s.info()["cpython"] and time.monotonic() < deadline:
                time.sleep(0.05)
            before = s.info()["cpython"]
            py.stdin.write("go\n")
            py.stdin.flush()
            while s.info()["cpython"][str(py.pid)]["cpython"] and time.monotonic() < deadline:
                time.sleep(0.05)
            after = s.info()["cpython"]
        finally:
            s.stop()
    finally:
        for p in (native, py):
            p.kill()
            p.wait()
    assert before[str(native.pid)]["cpython"] is False and "executable file mappings" in before[str(native.pid)]["evidence"]
    assert before[str(py.pid)]["cpython"] is True and "python" in before[str(py.pid)]["evidence"], before
    assert after[str(py.pid)]["cpython"] is False, after  # it runs sleep now


HOLD = """
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
print("ready", flush=True)
sys.stdin.readline()
"""


def test_cli_file_samples_the_processes_holding_it_and_not_others(tmp_path):
    """`sample --file F`: whoever has F open (found in /proc), not a process holding another file."""
    f, other = tmp_path / "table.bin", tmp_path / "other.bin"
    for x in (f, other):
        x.write_bytes(b"\0" * 4096)
    kids = [_child(HOLD, str(f)), _child(HOLD, str(f)), _child(HOLD, str(other))]
    try:
        for k in kids:
            _expect(k, "ready")
        p = _cli("sample", "--file", str(f), "--json", "--duration", "1.5")
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert f"Sampling reads of {f}" in err
        s = json.loads(out)
        assert sorted(x["pid"] for x in s["processes"]) == sorted(k.pid for k in kids[:2])
        assert s["process"]["pid"] in (kids[0].pid, kids[1].pid)
    finally:
        for k in kids:
            _stop_child(k)


def test_cli_file_that_does_not_exist_exit_2(tmp_path):
    p = _cli("sample", "--file", str(tmp_path / "gone" / "t.bin"), "--duration", "1")
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and err.strip().count("\n") == 0 and "No such file" in err, err
