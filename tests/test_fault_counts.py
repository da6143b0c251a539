"""Major faults counted as the kernel counts them, on mapped readers nobody here wrote (real eBPF).

The truth is the kernel's own per-thread counter (``majflt``, /proc/PID/task/TID/stat field 12),
the one ``getrusage`` reports: read by this test for every thread before the window and by the
reader itself at its end (a thread that exits inside the window reports its own, from
/proc/thread-self/stat, just before it ends).  Readahead is left as each library leaves it (on:
the lab's reader sets MADV_RANDOM, which hides retried passes), and the table is evicted every
step (POSIX_FADV_DONTNEED), so faults race with readahead in flight: the first pass of a fault
waits for a page another fault's read-around is bringing in, or hits the readahead marker and
starts async readahead; either retries (VM_FAULT_RETRY) and the kernel counts it minor.

Readers: LMDB random ``get`` (one Python thread, plus one that reads and exits mid-window) and a
faiss IVF-Flat index opened with ``IO_FLAG_MMAP`` searched by its OpenMP pool (native threads).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import threading
import time

import numpy as np
import pytest

from engramprof import trace
from engramprof.host.files import CODE_PATH
from tests.tracing import PY

LMDB_KEYS, LMDB_VALUE = 8000, 3000  # ~32 MiB
FAISS_D, FAISS_N, FAISS_NLIST = 32, 120_000, 256  # ~16 MiB of codes

MAJFLT = 9  # /proc/PID/stat field 12, after the ")" of the name


def _majflt(stat_path: str) -> int:
    with open(stat_path) as f:
        return int(f.read().rsplit(")", 1)[1].split()[MAJFLT])


def _task_majflt(pid: int) -> dict[int, int]:
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(t)] = _majflt(f"/proc/{pid}/task/{t}/stat")
        except FileNotFoundError:
            pass
    return out


COMMON = textwrap.dedent("""
    import json, os, signal, sys, threading

    def majflt(stat_path):
        try:
            with open(stat_path) as f:
                return int(f.read().rsplit(")", 1)[1].split()[9])
        except FileNotFoundError:  # a thread (an OpenMP worker) exited after the listing
            return None

    def wait_for_window():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        print("ready", file=sys.stderr, flush=True)
        signal.sigwait({signal.SIGUSR1})

    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

    def evict(path, fd):
        # a page still mapped is never dropped by POSIX_FADV_DONTNEED: first zap this process's
        # page tables over the file's mappings (MADV_DONTNEED: the pages stay in the cache)
        path = os.path.realpath(path)
        for line in open("/proc/self/maps"):
            if line.split(None, 5)[-1].strip() == path:
                a, b = (int(x, 16) for x in line.split()[0].split("-"))
                libc.madvise(a, b - a, 4)  # MADV_DONTNEED
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def report(exited):
        live = {int(t): m for t in os.listdir("/proc/self/task")
                if (m := majflt(f"/proc/self/task/{t}/stat")) is not None}
        print(json.dumps({"live": live, "exited": exited, "process": majflt("/proc/self/stat")}), flush=True)
""")

LMDB_READER = COMMON + textwrap.dedent("""
    import random
    import lmdb

    path, steps, per_step, nkeys = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    env = lmdb.open(path, readonly=True, lock=False)  # readahead: the library's default (on)
    data_path = os.path.join(path, "data.mdb")
    data = os.open(data_path, os.O_RDONLY)

    def gets(rng, n):
        s = 0
        with env.begin() as txn:
            for _ in range(n):
                s += txn.get(b"%08d" % rng.randrange(nkeys))[0]
        return s

    exited = {}

    def exiting_worker(seed):
        evict(data_path, data)
        gets(random.Random(seed), per_step)
        exited[threading.get_native_id()] = majflt("/proc/thread-self/stat")

    wait_for_window()
    rng = random.Random(1)
    for step in range(steps):
        evict(data_path, data)  # evicted every step
        gets(rng, per_step)
        if step == steps // 2:  # a thread that reads and exits inside the window
            t = threading.Thread(target=exiting_worker, args=(step,))
            t.start()
            t.join()
    report(exited)
""")

FAISS_READER = COMMON + textwrap.dedent("""
    import numpy as np
    import faiss

    path, steps, nq, nprobe = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    faiss.omp_set_num_threads(2)
    index = faiss.read_index(path, faiss.IO_FLAG_MMAP)  # the inverted lists stay in the file's mapping
    index.nprobe = nprobe
    fd = os.open(path, os.O_RDONLY)
    rng = np.random.default_rng(5)
    index.search(rng.random((8, index.d), dtype=np.float32), 4)  # the OpenMP pool exists before the window
    mapped = any(path in line for line in open("/proc/self/maps"))
    wait_for_window()
    for step in range(steps):
        evict(path, fd)  # evicted every step
        index.search(rng.random((nq, index.d), dtype=np.float32), 10)
    exited = {}
    print("mapped", mapped, file=sys.stderr, flush=True)
    report(exited)
""")


def _traced(tmp, name, argv):
    """Run argv under the recorder; returns (fault events, per-thread majflt growth over the
    window (the kernel's), the tracer summary)."""
    from engramprof.record.recorder import Recorder

    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        if "ready" in line:
            break
    out = tmp / name
    t = Recorder(p.pid, output=str(out), sample_hz=0, offcpu=False, fault_address=True)
    t.start()
    assert t.faults is not None, t.notes
    runner = threading.Thread(target=t.run, kwargs={"duration": 90})
    runner.start()
    start = _task_majflt(p.pid)
    start_process = _majflt(f"/proc/{p.pid}/stat")
    os.kill(p.pid, signal.SIGUSR1)
    stdout, stderr = p.communicate(timeout=90)
    runner.join(90)
    summary = t.finish()
    assert p.returncode == 0, stderr
    truth = json.loads(stdout.strip().splitlines()[-1])
    growth = {int(tid): m - start.get(int(tid), 0) for tid, m in truth["live"].items()}
    growth.update({int(tid): m for tid, m in truth["exited"].items()})  # born inside the window
    # threads born and gone inside the window without a word (a library's own pool): only the
    # process's counter has them (a thread's counts join it when the thread exits)
    growth["others"] = truth["process"] - start_process - sum(growth.values())
    ev = trace.load(out)
    return ev[ev["kind"] == "fault"], growth, summary, stderr, out


def _assert_counts_equal(faults, growth, summary, min_major):
    """Per thread and in all: the probe's major faults == the kernel's, within 1% (+1 for a
    fault of the reader's exit path after its last reading of the counter)."""
    counted = faults.groupby("tid")["major"].sum().astype(int).to_dict()
    counted["others"] = sum(n for tid, n in counted.items() if tid not in growth)
    total = sum(growth.values())
    assert total >= min_major, growth  # enough major faults for 1% to mean something
    for tid, kernel in growth.items():
        got = counted.get(tid, 0)
        assert abs(got - kernel) <= max(1, 0.01 * kernel), (tid, got, kernel, counted, growth)
    got_total = int(faults["major"].sum())
    assert abs(got_total - total) <= max(2, 0.01 * total), (got_total, total, counted, growth)
    f = summary["faults"]
    assert f["lost_records"] == 0 and f.get("no_state", 0) == 0
    assert f["major"] == got_total  # the probe's totals and its records agree


@pytest.fixture(scope="module")
def lmdb_env(tmp_path_factory):
    lmdb = pytest.importorskip("lmdb", reason="lmdb (dev extra) is not installed")
    d = tmp_path_factory.mktemp("lmdb") / "db"
    env = lmdb.open(str(d), map_size=1 << 30)
    rng = np.random.default_rng(2)
    with env.begin(write=True) as txn:
        for i in range(LMDB_KEYS):
            txn.put(b"%08d" % i, rng.bytes(LMDB_VALUE))
    env.sync()
    env.close()
    os.sync()  # clean pages: DONTNEED can evict them
    return d


@pytest.fixture(scope="module")
def faiss_index(tmp_path_factory):
    faiss = pytest.importorskip("faiss", reason="faiss-cpu (dev extra) is not installed")
    p = tmp_path_factory.mktemp("faiss") / "ivf.index"
    rng = np.random.default_rng(3)
    xb = rng.random((FAISS_N, FAISS_D), dtype=np.float32)
    quant = faiss.IndexFlatL2(FAISS_D)
    index = faiss.IndexIVFFlat(quant, FAISS_D, FAISS_NLIST)
    index.train(xb[:20_000])
    index.add(xb)
    faiss.write_index(index, str(p))
    os.sync()
    return p


@pytest.mark.bpf
def test_lmdb_major_faults_equal_the_kernels_per_thread(tmp_path, lmdb_env):
    script = tmp_path / "lmdb_reader.py"
    script.write_text(LMDB_READER)
    faults, growth, summary, _, _ = _traced(tmp_path, "lmdb", [PY, str(script), str(lmdb_env), "12", "400",
                                                            str(LMDB_KEYS)])
    exited = [tid for tid in growth if tid != "others" and tid > min(t for t in growth if t != "others")]
    assert exited and all(growth[t] > 0 for t in exited), growth  # the thread that exited read cold pages
    _assert_counts_equal(faults, growth, summary, min_major=60)
    data = faults[faults["path"] == str(lmdb_env / "data.mdb")]
    flt = summary["faults"]
    # faults retried without being major happened (the first pass waited for a page another
    # fault's read-around was bringing in): counting every retried fault as major is wrong here
    assert flt["retried"] > flt["major"] + 2, flt
    assert int(data["major"].sum()) >= 0.9 * int(faults["major"].sum())
    assert (data.loc[data["major"], "pages_added"] > 0).all()  # a major fault here read its page in


@pytest.mark.bpf
def test_faiss_mmap_search_major_faults_equal_the_kernels_per_thread(tmp_path, faiss_index):
    script = tmp_path / "faiss_reader.py"
    script.write_text(FAISS_READER)
    faults, growth, summary, stderr, _ = _traced(tmp_path, "faiss", [PY, str(script), str(faiss_index), "12", "64", "32"])
    assert "mapped True" in stderr  # IO_FLAG_MMAP really served the lists from the file's mapping
    readers = [tid for tid, n in faults[faults["path"] == str(faiss_index)].groupby("tid").size().items() if n]
    assert len(readers) >= 2, readers  # the OpenMP pool's native thread faulted too
    _assert_counts_equal(faults, growth, summary, min_major=30)
    flt = summary["faults"]
    # minor faults that started async readahead (they insert pages, but not their own): counted
    # apart, not major; and retried faults that were not major
    assert flt["async_ra"] > 0 and flt["retried"] > flt["major"] + 2, flt


PREAD_READER = COMMON + textwrap.dedent("""
    path = sys.argv[1]
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    wait_for_window()
    import decimal, zlib  # a server's lazy import: faults on shared objects' pages, no table read
    import time
    time.sleep(0.6)  # a server lives on: the recorder reads its maps while the mappings are there
    n = 0
    for step in range(20):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        for off in range(0, size, 64 * 4096):
            n += len(os.pread(fd, 4096, off))
        zlib.crc32(bytes(decimal.Decimal(step).as_integer_ratio()[0] % 256 for _ in range(8)))
    report({})
""")


@pytest.mark.bpf
def test_a_pread_only_reader_is_read_path_syscalls_and_its_code_faults_are_counted_apart(tmp_path):
    """Faults on the process's own shared objects are not table reads: read_path stays
    ``syscalls`` and they are named ``code_faults`` (recorder summary, batch-tail, diagnose)."""
    from engramprof.analysis import analyse
    from engramprof.analysis.diagnose import read_path_of

    data = tmp_path / "table.bin"
    data.write_bytes(np.random.default_rng(1).bytes(4 << 20))
    os.sync()
    script = tmp_path / "pread_reader.py"
    script.write_text(PREAD_READER)
    faults, _, summary, _, out = _traced(tmp_path, "pread", [PY, str(script), str(data)])
    flt = summary["faults"]
    assert len(faults) > 0 and flt["code_faults"] == len(faults), (flt, faults["path"].tolist())
    assert all(CODE_PATH.search(p) for p in faults["path"].astype(str)), faults["path"].tolist()
    assert faults["on_code"].all(), faults.loc[~faults["on_code"], "path"].tolist()  # the recorder's own flag (format 6)
    bt = analyse(trace.load_bundle(out)).summary
    assert set(bt["read_events"]) == {"syscall"} and bt["code_faults"] == len(faults), bt["read_events"]
    assert read_path_of(bt) == "syscalls"


def test_code_faults_do_not_make_a_syscall_batch_mixed_or_both():
    """A pread reader whose batches also fault on its own shared objects: compare's per-batch
    read_path and batch-tail's read_events see syscalls only; the faults are code_faults."""
    import pandas as pd

    from engramprof.analysis import read_event_counts
    from engramprof.analysis.diagnose import read_path_of
    from engramprof.analysis.events import code_faults
    from engramprof.compare.load import _read_paths

    n_sys, so = 20, "/venv/lib/python3.13/site-packages/numpy/_core/_multiarray_umath.cpython-313-x86_64-linux-gnu.so"
    kinds = ["syscall"] * n_sys + ["fault"] * 6
    paths = ["/data/table.bin"] * n_sys + [so, so, "/usr/bin/python3.13", "/usr/lib/locale/locale-archive",
                                             "/etc/ld.so.cache", "/venv/numpy.libs/libscipy_openblas64_-ff651d7f.so"]
    calls = pd.DataFrame({"kind": pd.Categorical(kinds), "path": pd.Categorical(paths),
                          "ts_ns": np.r_[np.arange(n_sys) * 10, np.arange(6) * 30 + 5].astype(np.int64)})
    calls = calls.sort_values("ts_ns", kind="stable").reset_index(drop=True)
    assert int(code_faults(calls).sum()) == 6
    ev = read_event_counts(calls)
    assert ev == {"syscall": n_sys}
    assert read_path_of({"read_events": ev}) == "syscalls"
    paths_per_batch = _read_paths(calls, np.array([0, 100]), np.array([99, 199]), np.array([10, 10]))
    assert list(paths_per_batch) == ["syscall", "syscall"]
    # a mapped table's faults are table reads
    data = calls.assign(path=pd.Categorical(["/data/table.bin"] * len(calls)))
    assert read_event_counts(data) == {"syscall": n_sys, "fault": 6}


def test_a_fault_the_recorder_flags_as_code_is_code_wherever_the_file_lives():
    """An interpreter outside the system's directories (conda's /opt/conda/bin/python, uv's
    ~/.local/share/uv/python/.../bin/python3.12) matches no CODE_PATH rule: the recorder's
    ``on_code`` (the file is mapped executable) names it; without the column, the path decides."""
    import pandas as pd

    from engramprof.analysis import read_event_counts
    from engramprof.analysis.events import code_faults

    paths = ["/data/table.bin"] * 4 + ["/opt/conda/bin/python3.11"] * 3
    calls = pd.DataFrame({"kind": pd.Categorical(["fault"] * 7), "path": pd.Categorical(paths),
                          "ts_ns": np.arange(7, dtype=np.int64)})
    assert int(code_faults(calls).sum()) == 0  # format 5: the path alone cannot tell
    flagged = calls.assign(on_code=[False] * 4 + [True] * 3)
    assert code_faults(flagged).tolist() == [False] * 4 + [True] * 3
    assert read_event_counts(flagged) == {"fault": 4}


KERNEL_MODE_WRITER = COMMON + textwrap.dedent("""
    import mmap
    path, out_path = sys.argv[1], sys.argv[2]
    fd = os.open(path, os.O_RDONLY)
    m = mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ)
    m.madvise(mmap.MADV_RANDOM)  # one fault a page (readahead on is the LMDB and faiss tests')
    out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    mv = memoryview(m)
    wait_for_window()
    for step in range(4):
        evict(path, fd)
        os.pwrite(out, mv[step << 20:(step << 20) + (128 << 10)], 0)  # the kernel copies from the cold mapping
    mv.release()
    report({})
""")


@pytest.mark.bpf
def test_faults_a_syscall_takes_on_a_mapping_are_each_counted(tmp_path):
    """Rows served zero-copy from a mapping (``write(fd, mapped rows)``) fault in kernel mode,
    one fault a page inside one syscall: each counted, as the kernel counts them."""
    data = tmp_path / "rows.bin"
    data.write_bytes(np.random.default_rng(4).bytes(8 << 20))
    os.sync()
    script = tmp_path / "writer.py"
    script.write_text(KERNEL_MODE_WRITER)
    faults, growth, summary, _, _ = _traced(tmp_path, "kmode", [PY, str(script), str(data), str(tmp_path / "out")])
    assert summary["faults"]["kernel_mode_faults"] >= 4 * 32  # 128 KiB a step, one fault a page at least
    _assert_counts_equal(faults, growth, summary, min_major=100)
