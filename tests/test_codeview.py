"""The code view (issue 24): Python stacks sampled with py-spy, joined to the reads and batches.

Real processes throughout: py-spy against live Python (and non-Python) processes, and one
`syscalls` recording of two lab readers at once (the pool reader and the NOWAIT reader, both
cached), analysed per process.  The lines the analysis must name are found in the lab's own
source, so a moved line moves the expectation, not the truth.
"""
from __future__ import annotations

import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from engramprof.analysis import codeview
from engramprof.analysis import stack_frames as sf
from engramprof.lab import readers
from engramprof.sampling.stacks import StackSampler, dump_error, find_py_spy, parse_dump
from tests.tracing import PY, Proc, engramprof

pytestmark = pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed (make setup installs it)")


def _line_of(func, text: str) -> int:
    """The line number of the first line of ``func`` holding ``text``."""
    src, first = inspect.getsourcelines(func)
    return first + next(i for i, ln in enumerate(src) if text in ln)


# ---- pure: what a stack says -----------------------------------------------------------

STDLIB = "/usr/lib/python3.11"


def _frames(*fs):
    return [sf.Frame(*f) for f in fs]


def test_site_is_the_first_user_frame_and_the_state_follows_frames_then_kernel():
    gather = _frames(("Condition.wait", f"{STDLIB}/threading.py", 320),
                     ("Future.result", f"{STDLIB}/concurrent/futures/_base.py", 451),
                     ("pool_read", "/srv/app/reader.py", 72), ("step", "/srv/app/server.py", 10))
    site = sf.site_of(gather)
    assert site.key == "pool_read (app/reader.py:72)" and site.via == ("Condition.wait", "Future.result")
    assert sf.state_of(gather, gil=False, active=True, in_blocked_read=False) == sf.FUTURE
    idle = _frames(("_worker", f"{STDLIB}/concurrent/futures/thread.py", 81), ("Thread.run", f"{STDLIB}/threading.py", 975))
    assert sf.is_worker(idle) and sf.state_of(idle, False, False, False) == sf.IDLE
    busy = _frames(("read_rows", "/srv/app/reader.py", 40), ("_WorkItem.run", f"{STDLIB}/concurrent/futures/thread.py", 58),
                   ("_worker", f"{STDLIB}/concurrent/futures/thread.py", 83))
    assert sf.is_worker(busy) and not sf.worker_idle(busy)
    # outside a Python wait, without the GIL: the kernel's off-CPU span decides
    assert sf.state_of(busy, True, True, False) == sf.CPU
    assert sf.state_of(busy, False, False, True) == sf.READ
    assert sf.state_of(busy, False, False, False, (2_000_000, False)) == sf.GIL_WAIT
    assert sf.state_of(busy, False, False, False, (50_000_000, False)) == sf.BLOCKED
    assert sf.state_of(busy, False, True, False, (2_000_000, True)) == sf.RUNQ
    assert sf.state_of(busy, False, True, False, (0, False)) == sf.NATIVE
    # a site-packages library is not machinery (its waits are not the interpreter's), but the site
    # is the user's line that called it: numpy's take wrapper names the gather
    assert not sf.is_machinery(sf.Frame("get", f"{STDLIB}/site-packages/rocksdict/__init__.py", 5))
    take = _frames(("_wrapfunc", f"{STDLIB}/site-packages/numpy/_core/fromnumeric.py", 54),
                   ("take", f"{STDLIB}/site-packages/numpy/_core/fromnumeric.py", 200),
                   ("_gather", "/srv/app/reader.py", 9), ("step", "/srv/app/server.py", 10))
    assert sf.site_of(take) == sf.Site(take[2], ("_wrapfunc", "take"))
    # an application installed as a package: its innermost frame outside the standard library
    app = _frames(("Condition.wait", f"{STDLIB}/threading.py", 320), ("serve", f"{STDLIB}/site-packages/app/s.py", 3))
    assert sf.site_of(app).key == "serve (app/s.py:3)"


def test_py_spy_output_and_errors_read():
    rows = parse_dump(json.dumps([{"pid": 7, "os_thread_id": 8, "thread_name": "MainThread", "owns_gil": True,
                                   "active": True, "frames": [{"name": "f", "filename": "/a/b.py", "line": 3}]},
                                  {"pid": 7, "thread_id": 1, "os_thread_id": None, "frames": []}]))
    assert rows == [{"pid": 7, "tid": 8, "thread_name": "MainThread", "gil": True, "active": True,
                     "frames": "f\t/a/b.py\t3", "depth": 1}]
    assert dump_error("WARN x\nError: Failed to find python version from target process\n", 9) == \
        "pid 9: Failed to find python version from target process"


def _stack_rows(rows):
    import pandas as pd

    out = []
    for rnd, (t_ms, tid, name, text) in enumerate(rows, 1):
        out.append({"ts_ns": int(t_ms * 1e6), "window_ns": 2_000_000, "round": rnd, "pid": 1, "tid": tid,
                    "thread_name": name, "gil": False, "active": True, "frames": text, "depth": text.count("\n") + 1})
    return pd.DataFrame(out)


def test_reads_join_their_own_threads_nearest_busy_sample_and_its_submitter():
    import pandas as pd

    worker = (f"read_rows\t/srv/app/reader.py\t40\n_WorkItem.run\t{STDLIB}/concurrent/futures/thread.py\t58\n"
              f"_worker\t{STDLIB}/concurrent/futures/thread.py\t83")
    idle = f"_worker\t{STDLIB}/concurrent/futures/thread.py\t81"
    gather = (f"Condition.wait\t{STDLIB}/threading.py\t320\nFuture.result\t{STDLIB}/concurrent/futures/_base.py\t451\n"
              "pool_read\t/srv/app/reader.py\t72")
    inline = "scan\t/srv/app/scan.py\t9"
    stacks = _stack_rows([(100, 11, "w1", worker), (100, 10, "MainThread", gather), (200, 11, "w1", idle),
                          (300, 12, "w2", idle), (300, 10, "MainThread", inline)])
    stacks.loc[1, "round"] = 1  # the worker and the gathering main thread: one round
    # w2's second read sleeps 10 ms across w1's busy sample's window: another thread's stack
    calls = pd.DataFrame({"ts_ns": [int(99.5e6), int(250e6), int(299e6), int(5000e6), int(95e6)],
                          "dur_ns": [1000] * 4 + [10_000_000], "pid": [1] * 5, "tid": [11, 11, 10, 12, 12],
                          "pages_added": [0, 1, 0, 0, 0], "offcpu_ns": [0] * 4 + [9_000_000], "runq_ns": 0})
    samples = codeview.prepare_samples(stacks, calls)
    j = codeview.join_reads(samples, calls)
    # w1's reads: its busy sample (the idle one at 200 ms names no site), inside its window, then
    # near; the main thread's read: its own inline scan; w2 (never busy): its pool's w1, never
    # exact (w1's stack was not read during w2's read)
    assert list(j["site"]) == ["read_rows (app/reader.py:40)"] * 2 + ["scan (app/scan.py:9)"] + \
        ["read_rows (app/reader.py:40)"] * 2
    assert list(j["join"]) == ["inside", "near", "inside", "pool", "pool"]
    assert not j["exact"].any()
    assert [x if isinstance(x, str) else None for x in j["submitter"]] == [
        "pool_read (app/reader.py)", "pool_read (app/reader.py)", None, "pool_read (app/reader.py)",
        "pool_read (app/reader.py)"]
    sites = codeview.read_sites(calls, j, slow_ms=4.0)
    assert sites[0]["site"] == "read_rows (app/reader.py:40)" and sites[0]["misses"] == 1 and sites[0]["reads"] == 4
    assert [s["share"] for s in sites] == [0.8, 0.2]


def test_a_read_takes_its_functions_call_line_unless_sampled_inside_its_blocked_read():
    """A sample holding the GIL is executing bytecode: its line (the loop's head) names no read;
    the read takes the line its function is seen in a call at most often.  A sample taken while
    the thread was blocked in a read overlapping its window keeps its own line (exact).  A page
    fault, taken by the running code, takes the line its function is seen at most at all."""
    import pandas as pd

    pool = f"\n_WorkItem.run\t{STDLIB}/concurrent/futures/thread.py\t58\n_worker\t{STDLIB}/concurrent/futures/thread.py\t83"
    at = {ln: f"read_rows\t/srv/app/reader.py\t{ln}{pool}" for ln in (38, 40)}
    scan = {ln: f"scan\t/srv/app/scan.py\t{ln}" for ln in (9, 12)}
    gather = {ln: f"gather\t/srv/app/g.py\t{ln}" for ln in (5, 7)}
    stacks = _stack_rows([(100, 11, "w1", at[40]), (200, 11, "w1", at[38]), (300, 11, "w1", at[38]),
                          (400, 11, "w1", at[40]), (450, 12, "MainThread", scan[9]), (528, 12, "MainThread", scan[12]),
                          (560, 12, "MainThread", scan[9]), (700, 13, "g", gather[5]), (710, 13, "g", gather[5]),
                          (720, 13, "g", gather[7])])
    # 200 ms: holding the GIL; 300 ms: a forced switch at the loop's head; the gather faults holding it
    stacks["gil"] = [False, True, False, False, False, False, False, True, True, False]
    calls = pd.DataFrame({"ts_ns": [int(199e6), int(301e6), int(500e6), int(600e6), int(722e6), int(723e6)],
                          "dur_ns": [1000, 1000, 30_000_000, 1000, 1000, 1000], "pid": [1] * 6,
                          "tid": [11, 11, 12, 12, 13, 13], "offcpu_ns": [0, 0, 25_000_000, 0, 0, 0], "runq_ns": [0] * 6,
                          "kind": pd.Categorical(["syscall"] * 5 + ["fault"], categories=["syscall", "fault"])})
    samples = codeview.prepare_samples(stacks, calls)
    assert samples["state"].tolist()[5] == sf.READ  # the 30 ms read slept across its window
    assert codeview.call_lines(samples[samples["user"]]) == {(1, "read_rows (app/reader.py)"): "read_rows (app/reader.py:40)",
                                                            (1, "scan (app/scan.py)"): "scan (app/scan.py:9)",
                                                            (1, "gather (app/g.py)"): "gather (app/g.py:7)"}
    j = codeview.join_reads(samples, calls)
    assert list(j["site"]) == ["read_rows (app/reader.py:40)"] * 2 + ["scan (app/scan.py:12)", "scan (app/scan.py:9)",
                                                                    "gather (app/g.py:7)", "gather (app/g.py:5)"]
    assert list(j["exact"]) == [False, False, True, False, False, False]


def test_a_read_takes_the_function_most_of_its_nearest_samples_show():
    """A step loop sampled every 200 ms: one sample in code that reads nothing (building the
    step's ids) among gather samples names none of the reads near it, not even the ones it is
    nearest to; a thread that moves from one reading function to another for good has each
    phase's reads at its own function, at most two samples' time off at the change.  A read that
    slept across its nearest sample's whole window keeps that sample's own site (exact)."""
    import numpy as np
    import pandas as pd

    ids, gather, other = "token_ids\t/srv/app/plan.py\t83", "gather\t/srv/app/g.py\t9", "scan\t/srv/app/scan.py\t4"
    # thread 1: gathers, once seen in token_ids (400 ms); thread 2: gather until 1 s, then scan
    rows = [(t, 1, "step", ids if t == 400 else gather) for t in range(0, 1000, 100)]
    rows += [(t, 2, "phases", gather if t < 1000 else other) for t in range(0, 2000, 100)]
    stacks = _stack_rows(rows)
    near_ids = [395e6, 400e6, 410e6]  # nearest to the token_ids sample
    phase = [300e6, 700e6, 1300e6, 1800e6]
    calls = pd.DataFrame({"ts_ns": np.array(near_ids + phase + [1390e6], dtype=np.int64),
                          "dur_ns": [1000] * 7 + [30_000_000], "pid": 1, "tid": [1, 1, 1, 2, 2, 2, 2, 2],
                          "offcpu_ns": [0] * 7 + [29_000_000], "runq_ns": 0})
    stacks.loc[stacks["ts_ns"] == int(1400e6), "frames"] = gather  # the last read slept across its window
    samples = codeview.prepare_samples(stacks, calls)
    j = codeview.join_reads(samples, calls)
    assert list(j["site"]) == ["gather (app/g.py:9)"] * 5 + ["scan (app/scan.py:4)"] * 2 + ["gather (app/g.py:9)"]
    assert list(j["exact"]) == [False] * 7 + [True]
    # the vote itself: per sample, the position whose function a read near it takes
    t = np.arange(7, dtype=np.int64) * 100
    assert codeview.vote(t, np.array(["a", "a", "b", "a", "a", "b", "b"])).tolist() == [0, 1, 1, 3, 5, 5, 6]

def test_native_frames_join_their_own_read_and_name_the_caller_of_libc():
    import pandas as pd

    from engramprof.sampling.native import short_name

    assert short_name("std::enable_if<(rocksdb::X)||(true), rocksdb::Status>::type "
                      "rocksdb::BlockBasedTable::RetrieveBlock<rocksdb::Block_kData>(a, b) const") == \
        "rocksdb::BlockBasedTable::RetrieveBlock<...>"
    assert short_name("rocksdict::rdict::Rdict::get::he65d45948b134986") == "rocksdict::rdict::Rdict::get"
    libc, so = "/usr/lib/x86_64-linux-gnu/libc.so.6", "/srv/librocksdb.so"
    text = f"pread64\t{libc}\t0\nrocksdb::A::Read\t{so}\t0\nrocksdb::B::Get\t{so}\t0"
    assert codeview.native_path(text) == "rocksdb::A::Read < rocksdb::B::Get"
    calls = pd.DataFrame({"pid": [1, 1, 1], "tid": [2, 2, 3], "ts_ns": [10, 20, 10], "dur_ns": [5, 5_000_000, 5]})
    native = pd.DataFrame({"pid": [1], "tid": [2], "ts_ns": [20], "frames": [text], "depth": [3]})
    got = codeview.native_frames(native, calls)
    assert got.tolist() == [None, text, None]  # only the read whose own stack was copied
    sites = codeview.native_sites(calls, got, slow_ms=4.0)
    assert sites == [{"path": "rocksdb::A::Read < rocksdb::B::Get", "function": "rocksdb::A::Read", "stacks": 1,
                      "share": 1.0, "read_ms": 5.0}]


# ---- real: py-spy against live processes, no eBPF ---------------------------------------

SCRIPT = """
import threading, time
import numpy  # OpenBLAS starts its own (native) thread on a machine with more than one CPU
def sleeper():
    while True:
        time.sleep(0.5)          # SLEEP
def spin():
    x = 0
    while True:
        x += 1                   # SPIN
threading.Thread(target=sleeper, name="sleeper", daemon=True).start()
print("ready", flush=True)
spin()
"""


def test_sampler_names_lines_and_gil_holder_and_one_line_for_a_non_python_process(tmp_path):
    script = tmp_path / "target.py"
    script.write_text(SCRIPT)
    py = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    other = subprocess.Popen(["sleep", "60"])
    try:
        assert py.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # past the print, into spin()
        notes: list[str] = []
        s = StackSampler(lambda: [other.pid, py.pid], hz=20, notes=notes)
        for _ in range(12):
            s.sample_round()
        s.flush()
    finally:
        py.kill()
        other.kill()
        py.wait()
        other.wait()
    # the non-CPython process: one note naming it, never sampled again; the other one sampled
    assert len(notes) == 1 and notes[0].startswith(f"Python stacks not sampled: pid {other.pid}:"), notes
    assert s.summary()["not_sampled"].keys() == {other.pid} and s.summary()["processes"] == [py.pid]
    assert s.dumps == 12 + 1  # the refused pid was asked once
    rows = s.rows
    assert {r["pid"] for r in rows} == {py.pid} and len({r["round"] for r in rows}) >= 10
    lines = script.read_text().splitlines()
    spin_line = next(i for i, ln in enumerate(lines, 1) if "# SPIN" in ln)
    sleep_line = next(i for i, ln in enumerate(lines, 1) if "# SLEEP" in ln)
    main = [r for r in rows if r["thread_name"] == "MainThread"]
    slept = [r for r in rows if r["thread_name"] == "sleeper"]

    def sites(rs):
        return {(f.func, f.file, f.line) for f in (sf.site_of(sf.parse(r["frames"])).frame for r in rs)}

    assert sites(main) <= {("spin", str(script), spin_line), ("spin", str(script), spin_line - 1)}, sites(main)
    assert sites(slept) == {("sleeper", str(script), sleep_line)}
    # the sleeping thread never holds the GIL; the spinning one holds it in most rounds
    assert not any(r["gil"] for r in slept)
    assert sum(r["gil"] for r in main) >= len(main) // 2, [(r["gil"], r["active"]) for r in main]
    assert all(r["window_ns"] > 0 for r in rows)
    # thread kinds: the two Python threads python; every other thread of the process (OpenBLAS's)
    # native, and there is one on a machine with more than one CPU
    kinds = s.thread_kinds().to_pylist()
    python = {k["tid"] for k in kinds if k["kind"] == "python"}
    native = {k["tid"] for k in kinds if k["kind"] == "native"}
    assert python == {r["tid"] for r in main + slept} and len(python) == 2
    assert native.isdisjoint(python) and {k["pid"] for k in kinds} == {py.pid}
    if (os.cpu_count() or 1) > 1:
        assert native, kinds


def _fake_py_spy(tmp_path, torn_first: int):
    """A py-spy whose first ``torn_first`` dumps fail as a torn read does ("Failed to get stack
    traces"), then give one thread's stack."""
    count = tmp_path / "dumps"
    count.write_text("0")
    out = json.dumps([{"pid": 1, "os_thread_id": 11, "thread_name": "MainThread", "owns_gil": True, "active": True,
                       "frames": [{"name": "step", "filename": "/srv/reader.py", "line": 7}]}])
    fake = tmp_path / "py-spy"
    fake.write_text(f"""#!/bin/sh
n=$(($(cat {count}) + 1)); echo $n > {count}
if [ $n -le {torn_first} ]; then echo "Error: Failed to get stack traces" >&2; exit 1; fi
echo '{out}'
""")
    fake.chmod(0o755)
    return str(fake)


def test_a_torn_first_dump_is_tried_again_and_only_then_refused(tmp_path):
    """py-spy reads a running process without pausing it: a dump taken while its threads start can
    fail ("Failed to get stack traces").  A process never sampled yet is dumped again, up to
    TORN_TRIES in a row, before it is refused (CI run 14: the pool reader's first dump failed so,
    and the whole recording had no stack of it)."""
    from engramprof.sampling import stacks

    s = StackSampler(lambda: [4242], hz=20, notes=(notes := []), binary=_fake_py_spy(tmp_path, 2))
    for _ in range(5):
        s.sample_round()
    s.flush()
    assert not notes and s.summary()["processes"] == [4242] and s.failed_dumps == 2
    assert len({r["round"] for r in s.rows}) == 3  # rounds 3, 4, 5
    # torn every time: refused after TORN_TRIES dumps, with one note
    (tmp_path / "b").mkdir()
    s = StackSampler(lambda: [4242], hz=20, notes=(notes := []), binary=_fake_py_spy(tmp_path / "b", 99))
    for _ in range(stacks.TORN_TRIES + 3):
        s.sample_round()
    assert s.dumps == stacks.TORN_TRIES and len(notes) == 1 and "Failed to get stack traces" in notes[0], notes


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv (util-linux)")
def test_a_python_process_whose_frames_cannot_be_read_is_one_note(tmp_path):
    """A CPython process py-spy may not read (run as nobody against root's process: no permission):
    one note with the reason, the process is not asked again, no rows."""
    wrapper = tmp_path / "py-spy-as-nobody"
    wrapper.write_text(f"#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 --clear-groups {find_py_spy()} \"$@\"\n")
    wrapper.chmod(0o755)
    py = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.1)"])
    try:
        notes: list[str] = []
        s = StackSampler(lambda: [py.pid], hz=20, notes=notes, binary=str(wrapper))
        for _ in range(3):
            s.sample_round()
        s.flush()
    finally:
        py.kill()
        py.wait()
    assert notes == [f"Python stacks not sampled: pid {py.pid}: Permission Denied (py-spy may not read its memory) "
                     "(not a CPython process, or its frames cannot be read); the rest of the recording is unchanged"], notes
    assert s.dumps == 1 and not s.rows and s.summary()["not_sampled"] == {py.pid: notes[0].split(": ", 1)[1].split(" (not")[0]}


# ---- real: two lab readers recorded at once, with eBPF ----------------------------------

@pytest.fixture(scope="module")
def two_readers(tmp_path_factory):
    """One `syscalls --stack-hz 20` recording of the pool reader and the NOWAIT reader, both on a
    cached table, back-to-back steps (--gap-ms 0: no time between steps to misplace a sample in)."""
    tmp = tmp_path_factory.mktemp("codeview")
    table = tmp / "t.safetensors"
    subprocess.run(engramprof("lab", "make-table", table, "--rows", "16384"), check=True, capture_output=True)
    # pool: the lab's decode step (4 tokens), 8 threads (a dump reads every thread's stack: fewer
    # threads, a shorter sample window on a loaded machine); nowait: 256 tokens, so that a step is
    # its read loop and outlasts a sample's window
    shape = {"pool": ("--threads", "8"), "nowait": ("--tokens", "256")}
    labs = {}
    for reader in ("pool", "nowait"):
        labs[reader] = Proc(engramprof("lab", "run", "--table", table, "--reader", reader, "--warm", "--duration", "4",
                                       "--gap-ms", "0", *shape[reader], "--start-delay", "120",
                                       "--markers", tmp / f"{reader}.jsonl", "--json"))
    for p in labs.values():
        p.wait_line("lab: ready")
    # and a reader that is not CPython: fio's psync job as a thread of its one process, paced, on
    # a file written (and cached) before: no write-back, no eviction (--invalidate=0), so the disk
    # stays idle for the lab readers.  It runs until the lab readers are done (then killed: the
    # recording ends when its last target exits), at most 120 s: a fixed 15 s ran out before the
    # tracer was tracing when the tracer's start-up took longer (load 14: no fio reads recorded)
    fio = None
    if shutil.which("fio"):
        (tmp / "fio.dat").write_bytes(os.urandom(8 << 20))
        fio = subprocess.Popen(["fio", "--name=codeview", f"--filename={tmp / 'fio.dat'}", "--size=8m",
                                "--rw=randread", "--bs=4k", "--ioengine=psync", "--rate_iops=300", "--invalidate=0",
                                "--time_based", "--runtime=120", "--thread"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = tmp / "trace"
    pids = [p.pid for p in labs.values()] + ([fio.pid] if fio is not None else [])
    tracer = Proc(engramprof("syscalls", *sum((["--pid", str(p)] for p in pids), []),
                             "--output", out, "--json", "--stack-hz", "20"))
    tracer.wait_line("Tracing")
    for p in labs.values():
        os.kill(p.pid, signal.SIGUSR1)
    for p in labs.values():
        rc, _, err = p.finish()
        assert rc == 0, err
    if fio is not None:
        fio.kill()
        fio.wait()
    rc, tout, terr = tracer.finish()
    assert rc == 0, terr
    from engramprof import trace
    from engramprof.analysis import batches

    tr = trace.load_bundle(out)
    pids = {k: p.pid for k, p in labs.items()}
    views = {}
    for reader, pid in pids.items():
        mdf, _ = batches.read_markers(tmp / f"{reader}.jsonl")
        views[reader] = codeview.code_view(tr.samples("stacks"), tr.calls, mdf, 4.0, pid=pid, meta=tr.meta,
                                           offcpu=tr.samples("offcpu"), native=tr.samples("native_stacks"))
    if fio is not None:
        views["fio"] = codeview.code_view(tr.samples("stacks"), tr.calls, None, 4.0, pid=fio.pid, meta=tr.meta,
                                          native=tr.samples("native_stacks"))
    return {"trace": out, "summary": json.loads(tout), "pids": pids, "views": views, "markers": tmp / "pool.jsonl",
            "fio": fio.pid if fio is not None else None,
            "read_tids": {k: set(tr.calls.loc[tr.calls["pid"] == pid, "tid"]) for k, pid in pids.items()},
            "kinds": tr.table("thread_kinds")}


@pytest.mark.bpf
def test_pool_reader_reads_at_its_read_line_submitted_from_the_gather_where_the_step_waits(two_readers):
    stacks = two_readers["summary"]["stacks"]
    assert sorted(stacks["processes"]) == sorted(two_readers["pids"].values()) and stacks["cpu_s"] > 0, stacks
    v = two_readers["views"]["pool"]
    read_line = _line_of(readers._read_rows, "n = preadv(")
    gather_line = _line_of(readers.PoolReader._run, "fut.result()")
    # the site of most reads (read_sites ranks by slow time, then miss time: on a loaded machine a
    # library page of the main thread evicted by others, faulted back in, can rank first)
    top = max(v["read_sites"], key=lambda s: s["reads"])
    assert top["site"] == f"_read_rows (lab/readers.py:{read_line})", v["read_sites"]
    assert top["submitted_from"] == "PoolReader._run (lab/readers.py)", top
    # the share joined at the read line: the line is the one _read_rows is seen in a call at most
    # often, not where the nearest sample sat (a sample holding the GIL sits anywhere in the loop:
    # a few such samples named 0.5 of the reads in CI run 6, docs/model.md, "The code view")
    assert top["reads"] >= 0.8 * v["join"]["reads"], (top, v["join"])
    assert v["step_thread"]["name"] == "MainThread" and v["step_thread"]["tid"] == two_readers["pids"]["pool"]
    # where the step waits: on the pool's futures at the gather line, more than in any other wait
    waits = [w for w in v["step_waits"] if w["state"] in (sf.FUTURE, sf.WAIT, sf.GIL_WAIT, sf.BLOCKED)]
    first = waits[0]
    assert (first["site"], first["state"]) == (f"PoolReader._run (lab/readers.py:{gather_line})", sf.FUTURE), v["step_waits"]
    assert first["via"] == "Condition.wait < Future.result"
    ps = v["python_scheduling"]
    assert ps["step_thread_gil_wait_share"] is not None and 0 <= ps["step_thread_gil_wait_share"] < first["share"]
    # every thread the kernel saw read was seen in the interpreter
    assert two_readers["read_tids"]["pool"] <= set(v["python_threads"][two_readers["pids"]["pool"]])
    # and tables/thread_kinds says so, for the analysis of thread kinds
    k = two_readers["kinds"]
    python = set(k.loc[(k["pid"] == two_readers["pids"]["pool"]) & (k["kind"] == "python"), "tid"])
    assert two_readers["read_tids"]["pool"] <= python
    assert "PoolReader._run (lab/readers.py" in v["fix"] and "cached" in v["fix"], v["fix"]


@pytest.mark.bpf
def test_nowait_reader_spends_its_step_in_its_own_read_loop_on_cpu(two_readers):
    v = two_readers["views"]["nowait"]
    loop = [w for w in v["step_waits"] if w["site"].startswith("NowaitReader._nowait_pass (lab/readers.py:")]
    assert sum(w["share"] for w in loop) > 0.5, v["step_waits"]
    # on a CPU (with the GIL, or without it in the read's copy), or runnable in the CPU's queue:
    # not waiting on anything of its own
    on_cpu = sum(w["share"] for w in loop if w["state"] in (sf.CPU, sf.NATIVE, sf.RUNQ))
    assert on_cpu > 0.5 * sum(w["share"] for w in loop), v["step_waits"]
    assert not any(w["state"] == sf.FUTURE for w in v["step_waits"])
    # its reads are its own: issued on the step thread, no pool behind them
    top = max(v["read_sites"], key=lambda s: s["reads"])  # as above: not a library fault that missed
    assert top["site"].startswith("NowaitReader._nowait_pass") and not top["submitted_from"], v["read_sites"]


@pytest.mark.bpf
def test_batch_tail_json_and_terminal_carry_the_code_view(two_readers, tmp_path):
    # the pool reader's markers, naming its pid: the summary is its (with batches inferred from the
    # reads, the slowest process was at times fio's, whose view is a note)
    pool = two_readers["pids"]["pool"]
    markers = tmp_path / "pool.jsonl"
    markers.write_text("".join(json.dumps(json.loads(ln) | {"pid": pool}) + "\n"
                               for ln in two_readers["markers"].read_text().splitlines()))
    r = subprocess.run(engramprof("batch-tail", two_readers["trace"], "--markers", markers, "--json"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    cv = summary["code_view"]
    assert cv.get("pid") == summary["slowest_process"] == pool and cv["read_sites"], cv
    # the split's python-scheduling time set against what the samples saw of it
    ps = cv["python_scheduling"]
    assert ps["split_ms"] >= 0 and ps["residual_ms"] == pytest.approx(
        max(ps["split_ms"] - ps["seen_gil_and_executor_ms"], 0), abs=0.01), ps
    # the terminal section, at 80 columns, from the same summary
    import io

    from rich.console import Console

    from engramprof.report.codeview import render_code_view

    buf = io.StringIO()
    render_code_view(Console(file=buf, width=80), cv)
    text = buf.getvalue()
    assert text.startswith(f"code view (pid {cv['pid']}") and "reads issued at" in text, text
    assert ("at the code: " in text) == bool(cv["fix"]), text  # a fix whenever a step thread was seen in batches
    assert max(len(ln.rstrip()) for ln in text.splitlines()) <= 80, text


@pytest.mark.bpf
def test_a_reader_that_is_not_cpython_is_one_note_and_its_native_frames(two_readers):
    """fio (C) recorded beside the two lab readers: one note with py-spy's reason, the lab readers'
    views as above (the rest unchanged), and fio's reads still get native call paths."""
    fio = two_readers["fio"]
    if fio is None:
        pytest.skip("fio is not installed")
    stacks = two_readers["summary"]["stacks"]
    assert str(fio) in stacks["not_sampled"] and fio not in stacks["processes"], stacks
    v = two_readers["views"]["fio"]
    assert v["note"].startswith(f"no Python stacks of pid {fio} (pid {fio}: ") and "\n" not in v["note"], v
    nat = v["native_read_sites"]
    assert nat and sum(r["stacks"] for r in nat) > 0, v
    # the C library's read is not the site: fio's own code that called it is (fio is stripped: an address)
    assert not nat[0]["function"].startswith(("pread", "__libc")), nat


@pytest.mark.bpf
def test_every_thread_of_a_process_that_is_not_cpython_is_native(two_readers):
    """The recorder tells CPython from other programs by their executable mappings: fio (C) is
    not CPython, the lab readers are; so fio's main thread is native, not Python (before: the
    main thread of any process was taken to run the interpreter, and fio's posixaio engine came
    out python-scheduling 19%), and no share of fio's batches is python-scheduling."""
    from engramprof import trace
    from engramprof.analysis import analyse, thread_kinds

    fio = two_readers["fio"]
    if fio is None:
        pytest.skip("fio is not installed")
    tr = trace.load_bundle(two_readers["trace"])
    procs = {p["pid"]: p for p in tr.meta["processes"]}
    assert procs[fio]["cpython"] is False and "fio" not in procs[fio]["cpython_evidence"], procs[fio]
    for pid in two_readers["pids"].values():
        assert procs[pid]["cpython"] is True and "python3" in procs[pid]["cpython_evidence"], procs[pid]
    assert thread_kinds.not_cpython_pids(tr.meta) == {fio: thread_kinds.not_cpython_pids(tr.meta)[fio]}
    mine = tr.calls[tr.calls["pid"] == fio]
    assert len(mine), "no fio reads recorded"
    kinds = thread_kinds.thread_kinds(set(mine["tid"]), None, tr.samples("threads"), tr.table("thread_kinds"),
                                      thread_kinds.not_cpython_pids(tr.meta), fio)
    assert fio in set(kinds["tid"]) or fio not in set(mine["tid"])
    assert (kinds.loc[kinds["tid"].isin(set(mine["tid"])), "kind"] == "native").all(), kinds
    th = tr.samples("threads")
    res = analyse(mine.reset_index(drop=True), samples={"threads": th[th["pid"] == fio]}, meta=tr.meta)
    assert res.summary["share"]["python-scheduling"] == 0.0, res.summary["share"]
    assert res.summary["thread_kinds"]["counts"]["python"] == 0, res.summary["thread_kinds"]
    assert {t["kind"] for t in res.summary["thread_kinds"]["threads"]} == {"native"}, res.summary["thread_kinds"]


def test_a_trace_without_stacks_says_why_in_one_line():
    import pandas as pd

    calls = pd.DataFrame({"ts_ns": [1], "dur_ns": [1], "pid": [5], "tid": [5]})
    meta = {"stacks": {"not_sampled": {"5": "pid 5: Failed to find python version from target process"}}}
    assert codeview.code_view(None, calls, None, 4.0, meta=meta) == {
        "note": "no Python stacks in this trace (pid 5: Failed to find python version from target process)"}
    assert "--stack-hz 0" in codeview.code_view(pd.DataFrame(), calls, None, 4.0, meta={"stacks": None})["note"]
