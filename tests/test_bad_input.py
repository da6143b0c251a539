"""The bad-input corpus: every case runs the real CLI as a subprocess and must give exactly
one line on stderr (``engramprof: ...``), no traceback, and the documented exit code: 2 for
bad arguments or input (usage errors included), 1 for a refusal at run time (a full disk).

Cases that need neither root nor eBPF come first; a few need root (a tmpfs) or a live
process (a zombie).  Each case is one subprocess of a few hundred ms.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parent.parent
PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
NO_PID = 999_999_999


def run(*args, timeout=60):
    env = dict(os.environ, COLUMNS="80")
    env.pop("ENGRAMPROF_DEBUG", None)
    return subprocess.run([PY, "-m", "engramprof", *map(str, args)], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout, env=env)


_RESULTS: dict[tuple, subprocess.CompletedProcess] = {}


def run_all(cases: list[list[str]]) -> None:
    """Run the cases not run yet, a few at a time (each is mostly interpreter start-up)."""
    from concurrent.futures import ThreadPoolExecutor

    todo = [tuple(c) for c in cases if tuple(c) not in _RESULTS]
    with ThreadPoolExecutor(4) as ex:
        for c, r in zip(todo, ex.map(lambda c: run(*c), todo)):
            _RESULTS[c] = r


def result(args: list[str], batch: list[list[str]]) -> subprocess.CompletedProcess:
    if tuple(args) not in _RESULTS:
        run_all(batch)
    return _RESULTS.get(tuple(args)) or run(*args)


def check(r, code: int, *words: str) -> str:
    """One line on stderr starting ``engramprof:``, no traceback, exit ``code``; the line
    contains each of ``words``."""
    err = r.stderr
    assert "Traceback" not in err and "Traceback" not in r.stdout, err
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    line = lines[0]
    assert line.startswith("engramprof: "), line
    assert not any(ch in line for ch in "╭╰│"), line  # not a rich box
    assert r.returncode == code, f"exit {r.returncode}, expected {code}: {line}"
    for w in words:
        assert w in line, f"{w!r} not in {line!r}"
    return line


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A small table, a valid trace bundle (synthetic calls), garbage files and a symlink."""
    from engramprof.lab import table
    from engramprof.trace import CALL_SCHEMA, TraceWriter

    d = tmp_path_factory.mktemp("bad")
    t = d / "table.safetensors"
    table.make_table(t, rows=1024, seed=1)
    n = 64
    df = pd.DataFrame({c: np.zeros(n, dtype=CALL_SCHEMA.field(c).type.to_pandas_dtype()) for c in CALL_SCHEMA.names})
    df["ts_ns"] = 1_000_000_000 + np.arange(n) * 10_000
    df["dur_ns"], df["pid"], df["tid"] = 2_000, 7, 7
    df["path"], df["offset"], df["size"], df["ret"] = str(t), 4096 + np.arange(n) * 256, 256, 256
    df["syscall"], df["tensor"], df["row"] = "preadv2", "", -1
    w = TraceWriter(d / "trace")
    w.append_calls(df)
    w.close()
    TraceWriter(d / "nocalls").close()  # a bundle whose target never read
    (d / "garbage.json").write_text("{not json")
    (d / "garbage.parquet").write_bytes(b"PAR1 this is not parquet at all")
    (d / "empty").write_text("")
    (d / "adir").mkdir()
    (d / "emptydir").mkdir()  # --file of a directory with no regular file
    bad_meta = d / "badmeta"
    bad_meta.mkdir()
    (bad_meta / "meta.json").write_text("{not json")
    (d / "markers-garbage.jsonl").write_text("nope\n[]\n")
    (d / "real-markers.jsonl").write_text("")
    os.symlink(d / "real-markers.jsonl", d / "markers-link.jsonl")
    return {"d": d, "table": t, "trace": d / "trace"}


# ------------------------------------------------------- usage errors (item 10): one line, 2

USAGE = [
    (["syscalls", "--pid", "1", "--duration", "abc"], ["--duration"]),
    (["sample", "--duration", "abc"], ["--duration"]),
    (["diagnose", "--pid", "abc"], ["--pid"]),
    (["no-such-command"], ["No such command"]),
    (["syscalls"], ["--pid"]),                      # missing required option
    (["diagnose"], ["--pid"]),
    (["lab", "run"], ["--table"]),
    (["batch-tail"], ["Missing argument 'TRACE'"]),  # named by its metavar, as --help names it
    (["replay"], ["Missing argument 'TRACE'"]),
    (["syscalls", "--pid", "1", "--bogus"], ["--bogus"]),
    (["doctor", "--bogus"], ["--bogus"]),
    (["lab", "bogus"], ["No such command"]),
    (["batch-tail", "x", "--top", "0"], ["--top"]),
    (["residency", "x", "--ranges", "-1"], ["--ranges"]),
    (["lab", "make-table", "/tmp/x", "--rows", "1.5"], ["--rows"]),
]


@pytest.mark.parametrize("args,words", USAGE, ids=[" ".join(a) for a, _ in USAGE])
def test_usage_error_is_one_line_exit_2(args, words):
    check(result(args, [a for a, _ in USAGE]), 2, *words)


def test_help_stays_rich_and_version():
    r = run("syscalls", "--help")
    assert r.returncode == 0 and "╭" in r.stdout and "--sample-hz" in r.stdout
    r = run("--version")
    from engramprof import __version__

    assert r.returncode == 0 and r.stdout.strip() == f"engramprof {__version__}"


# --------------------------------------------------- numbers (item 9): the same rules everywhere

NUMBERS = [
    (["syscalls", "--pid", "1", "--duration", "nan"], "--duration"),
    (["syscalls", "--pid", "1", "--duration", "inf"], "--duration"),
    (["syscalls", "--pid", "1", "--duration", "-1"], "--duration"),
    (["syscalls", "--pid", "1", "--sample-hz", "-1"], "--sample-hz"),
    (["syscalls", "--pid", "1", "--sample-hz", "100000"], "--sample-hz"),
    (["syscalls", "--pid", "1", "--sample-hz", "nan"], "--sample-hz"),
    (["syscalls", "--pid", "1", "--stack-hz", "-1"], "--stack-hz"),
    (["syscalls", "--pid", "1", "--stack-hz", "100"], "--stack-hz"),
    (["diagnose", "--pid", "1", "--stack-hz", "nan"], "--stack-hz"),
    (["syscalls", "--pid", "1", "--min-us", "-5"], "--min-us"),
    (["syscalls", "--pid", "1", "--min-us", "nan"], "--min-us"),
    (["syscalls", "--pid", "1", "--tid", "-1"], "--tid"),
    (["syscalls", "--pid", "0"], "--pid"),
    (["syscalls", "--pid", "1", "--hook", "nope"], "--hook"),
    (["sample", "--duration", "nan"], "--duration"),
    (["sample", "--duration", "inf"], "--duration"),
    (["sample", "--sample-hz", "-1"], "--sample-hz"),
    (["sample", "--sample-hz", "100000"], "--sample-hz"),
    (["sample", "--sample-hz", "0"], "--sample-hz"),
    (["sample", "--pid", "-3"], "--pid"),
    (["diagnose", "--pid", "1", "--duration", "nan"], "--duration"),
    (["diagnose", "--pid", "1", "--duration", "inf"], "--duration"),
    (["diagnose", "--pid", "1", "--duration", "1e10"], "--duration"),
    (["diagnose", "--pid", "1", "--slow-ms", "nan"], "--slow-ms"),
    (["diagnose", "--pid", "1", "--slow-ms", "-1"], "--slow-ms"),
    (["diagnose", "--pid", "0"], "--pid"),
    (["batch-tail", "{trace}", "--slow-ms", "nan"], "--slow-ms"),
    (["batch-tail", "{trace}", "--gap-ms", "-3"], "--gap-ms"),
    (["batch-tail", "{trace}", "--gap-ms", "inf"], "--gap-ms"),
    (["batch-tail", "{trace}", "--normal-miss-us", "0"], "--normal-miss-us"),
    (["batch-tail", "{trace}", "--min-share", "nan"], "--min-share"),
    (["batch-tail", "{trace}", "--min-share", "1.5"], "--min-share"),
    (["replay", "{trace}", "--cold-frac", "2"], "--cold-frac"),
    (["replay", "{trace}", "--cold-frac", "nan"], "--cold-frac"),
    (["replay", "{trace}", "--rounds", "0"], "--rounds"),
    (["replay", "{trace}", "--rows-per-batch", "0"], "--rows-per-batch"),
    (["replay", "{trace}", "--threads", "0"], "--threads"),
    (["replay", "{trace}", "--threads", "100000"], "--threads"),
    (["replay", "{trace}", "--batches", "0"], "--batches"),
    (["replay", "{trace}", "--gap-ms", "nan"], "--gap-ms"),
    (["replay", "{trace}", "--seed", "-1"], "--seed"),
    (["lab", "make-table", "{d}/n.st", "--rows", "0"], "--rows"),
    (["lab", "make-table", "{d}/n.st", "--dim", "33"], "--dim"),
    (["lab", "make-table", "{d}/n.st", "--dim", "-32"], "--dim"),
    (["lab", "make-table", "{d}/n.st", "--layers", "a,b"], "--layers"),
    (["lab", "make-table", "{d}/n.st", "--layers", "3,3"], "--layers"),
    (["lab", "make-table", "{d}/n.st", "--seed", "-4"], "--seed"),
    (["lab", "run", "--table", "{table}", "--duration", "nan"], "--duration"),
    (["lab", "run", "--table", "{table}", "--duration", "inf"], "--duration"),
    (["lab", "run", "--table", "{table}", "--steps", "-1"], "--steps"),
    (["lab", "run", "--table", "{table}", "--tokens", "0"], "--tokens"),
    (["lab", "run", "--table", "{table}", "--heads", "0"], "--heads"),
    (["lab", "run", "--table", "{table}", "--gap-ms", "nan"], "--gap-ms"),
    (["lab", "run", "--table", "{table}", "--zipf", "-1"], "--zipf"),
    (["lab", "run", "--table", "{table}", "--start-delay", "inf"], "--start-delay"),
    (["lab", "run", "--table", "{table}", "--threads", "0"], "--threads"),
    (["lab", "run", "--table", "{table}", "--seed", "-1"], "--seed"),
    (["lab", "run", "--table", "{table}", "--reader", "nope"], "--reader"),
    (["lab", "scenario", "residency", "--duration", "inf"], "--duration"),
    (["lab", "scenario", "residency", "--duration", "nan"], "--duration"),
    (["lab", "scenario", "residency", "--iops", "0"], "--iops"),
    (["lab", "scenario", "residency", "--evict-ms", "nan"], "--evict-ms"),
    (["lab", "scenario", "residency", "--memory-mib", "-1"], "--memory-mib"),
    (["lab", "scenario", "residency", "--rows", "0"], "--rows"),
    (["lab", "scenario", "residency", "--threads", "0"], "--threads"),
    (["lab", "scenario", "residency", "--seed", "-1"], "--seed"),
    (["lab", "scenario", "residency", "--reader", "nope"], "--reader"),
]


def _fill(args, inputs):
    return [a.format(**{k: str(v) for k, v in inputs.items()}) for a in args]


@pytest.mark.parametrize("args,flag", NUMBERS, ids=[" ".join(a) for a, _ in NUMBERS])
def test_bad_number_names_the_flag_exit_2(args, flag, inputs):
    check(result(_fill(args, inputs), [_fill(a, inputs) for a, _ in NUMBERS]), 2, flag)


NOT_NUMBERS = {"--hook", "--layers", "--reader"}  # words, lists: their own messages
UNPARSED = [(["sample", "--duration", "abc"], "--duration"), (["diagnose", "-p", "abc"], "--pid"),
            (["lab", "make-table", "{d}/n.st", "--rows", "1.5"], "--rows"), (["compare", "--top", "x"], "--top")]
WORDING = re.compile(r"^engramprof: (--[a-z-]+) must be (a number|an integer|a positive multiple)[^']*, got '[^']*'$")


@pytest.mark.parametrize("args,flag", [c for c in NUMBERS if c[1] not in NOT_NUMBERS] + UNPARSED,
                         ids=[" ".join(a) for a, f in NUMBERS + UNPARSED if f not in NOT_NUMBERS])
def test_every_bad_number_in_one_wording(args, flag, inputs):
    """``FLAG must be a number > 0, got 'x'``: the same words for a value out of range and for
    one that does not parse (which was "Invalid value for '--duration' / '-d': Input should be
    a valid number ...")."""
    line = check(result(_fill(args, inputs), [_fill(a, inputs) for a, _ in NUMBERS + UNPARSED]), 2, flag)
    m = WORDING.match(line)
    assert m and m.group(1) == flag, line


# ------------------------------------------------------------- files and inputs (item 13, ...)

FILES = [
    (["batch-tail", "{d}/nope"], ["no such trace"]),
    (["batch-tail", "{d}/adir"], ["no meta.json"]),
    (["batch-tail", "{d}/garbage.parquet"], ["not a trace"]),
    (["batch-tail", "{d}/garbage.json"], ["not a trace"]),
    (["batch-tail", "{d}/badmeta"], ["corrupt metadata"]),
    (["batch-tail", "{trace}", "--markers", "{d}/nope.jsonl"], ["no such markers file"]),
    (["batch-tail", "{trace}", "--markers", "{d}/adir"], ["is a directory"]),
    (["batch-tail", "{trace}", "--markers", "{d}/markers-garbage.jsonl"], ["2 bad lines"]),
    (["replay", "{d}/nope"], ["no such trace"]),
    (["replay", "{trace}", "--strategies", "bogus"], ["unknown bogus"]),
    (["replay", "{trace}", "--markers", "{d}/adir"], ["is a directory"]),
    (["residency"], ["give at least one PATH"]),
    (["residency", "{d}/nope"], ["no such file"]),
    (["residency", "{d}/adir"], ["is a directory"]),
    (["residency", "{d}/empty"], ["empty file"]),
    (["residency", "{table}", "--method", "bogus"], ["--method"]),
    (["residency", "--rows", "{d}/nope"], ["no such trace"]),
    (["residency", "--rows", "{d}/garbage.parquet"], ["not a trace"]),
    (["doctor", "--path", "{d}/nope"], ["no such file"]),
    (["doctor", "--path", "{table}"], ["--path", "not a directory"]),  # a regular file: no mount to test
    (["residency", "--rows", "{d}/nocalls"], ["--rows", "no calls"]),  # as batch-tail: exit 2, not an empty table
    (["batch-tail", "{d}/nocalls"], ["no calls"]),
    (["lab", "run", "--table", "{d}/nope"], ["no such file"]),
    (["lab", "run", "--table", "{d}/adir"], ["is a directory"]),
    (["lab", "run", "--table", "{d}/garbage.json"], []),
    (["lab", "run", "--table", "{table}", "--markers", "{d}/markers-link.jsonl"], ["symbolic link"]),
    (["lab", "run", "--table", "{table}", "--markers", "{d}/adir"], ["is a directory"]),
    (["lab", "run", "--table", "{table}", "--markers", "{d}/nodir/m.jsonl"], ["does not exist"]),
    (["lab", "make-table", "{table}"], ["already exists", "--force"]),
    (["lab", "make-table", "{d}/adir"], ["is a directory"]),
    (["lab", "make-table", "{d}/adir", "--force"], ["is a directory"]),
    (["lab", "make-table", "{d}/nodir/t.st"], ["does not exist"]),
    (["lab", "scenario", "nope"], ["unknown scenario"]),
    (["lab", "scenario", "residency", "--table", "{d}/adir"], ["is a directory"]),
    (["lab", "scenario", "residency", "--markers", "{d}/markers-link.jsonl"], ["symbolic link"]),
    (["diagnose", "--pid", "1", "--markers", "{d}/nope.jsonl"], ["no such markers file"]),
    (["diagnose", "--pid", "1", "--markers", "{d}/adir"], ["is a directory"]),
    (["syscalls", "--pid", str(NO_PID), "--duration", "1"], ["no process with pid"]),
    (["sample", "--pid", str(NO_PID), "--duration", "1"], ["no process with pid"]),
    (["diagnose", "--pid", str(NO_PID), "--duration", "1"], ["no process with pid"]),
    # target selectors (issue 13)
    (["syscalls", "--cgroup", "{d}/no-such-cgroup", "--duration", "1"], ["--cgroup", "no such cgroup directory"]),
    (["syscalls", "--cgroup", "{d}", "--duration", "1"], ["--cgroup", "not a cgroup"]),
    (["syscalls", "--cgroup", "{d}/empty", "--duration", "1"], ["--cgroup", "not a cgroup"]),
    (["diagnose", "--cgroup", "{d}/no-such-cgroup", "--duration", "1"], ["--cgroup", "no such cgroup directory"]),
    (["diagnose", "--cgroup", "{d}", "--duration", "1"], ["--cgroup", "not a cgroup"]),
    (["syscalls", "--pid", str(NO_PID), "--children", "--duration", "1"], ["no process with pid"]),
    (["diagnose", "--pid", str(NO_PID), "--children", "--duration", "1"], ["no process with pid"]),
    (["syscalls", "--children", "--cgroup", "{d}", "--duration", "1"], ["--children needs --pid"]),
    (["syscalls", "--file", "{d}/nope", "--duration", "1"], ["--file", "No such file"]),
    (["diagnose", "--file", "{d}/nope", "--duration", "1"], ["--file", "No such file"]),
    (["syscalls", "--file", "{d}/emptydir", "--duration", "1"], ["--file", "no regular file"]),
]


@pytest.mark.parametrize("args,words", FILES, ids=[" ".join(a) for a, _ in FILES])
def test_bad_file_or_input_is_one_line_exit_2(args, words, inputs):
    check(result(_fill(args, inputs), [_fill(a, inputs) for a, _ in FILES]), 2, *words)


def test_make_table_errors_do_not_start_with_a_blank_line(inputs):
    r = run("lab", "make-table", inputs["table"])
    assert r.stderr.startswith("engramprof: "), repr(r.stderr[:40])


# ------------------------------------------------------------------------ zombies (item 13)

@pytest.fixture
def zombie():
    p = subprocess.Popen(["true"])
    for _ in range(200):  # exited, not reaped: a zombie
        try:
            with open(f"/proc/{p.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except OSError:
            break
        import time

        time.sleep(0.01)
    yield p.pid
    p.wait()


@pytest.mark.parametrize("cmd", [["syscalls", "--duration", "1"], ["sample", "--duration", "1"],
                                 ["diagnose", "--duration", "1"], ["syscalls", "--children", "--duration", "1"]])
def test_zombie_pid_same_words_everywhere(cmd, zombie):
    line = check(run(cmd[0], "--pid", zombie, *cmd[1:]), 2, f"pid {zombie}", "has already exited (zombie)")
    assert "no process" not in line


# ----------------------------------------------------- a foreign Parquet file in calls/ (item 13)

def test_foreign_parquet_in_calls_is_skipped_with_a_note(inputs, tmp_path):
    import shutil

    tr = tmp_path / "trace"
    shutil.copytree(inputs["trace"], tr)
    pq.write_table(pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"]}), tr / "calls" / "part-999999.parquet")
    r = run("batch-tail", tr, "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["calls"] == 64, s["calls"]  # the foreign part's 3 rows are not calls
    assert any("part-999999.parquet" in n for n in s["notes"]), s["notes"]


# --------------------------------------------------------------------- full disk (item 12)

@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_make_table_on_a_full_disk_exit_1_one_line_no_partial_file(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        r = run("lab", "make-table", mnt / "t.safetensors", "--rows", "65536")
        check(r, 1, "not enough free space", "MiB")
        assert os.listdir(mnt) == []
        # a disk that fills during the write (the check passed, e.g. another writer): exit 1 too
        code = ("import sys; from unittest import mock; from engramprof.lab import table; "
                "mock.patch.object(table, 'check_space', lambda *a: None).start(); "
                "sys.argv = ['engramprof', 'lab', 'make-table', sys.argv[1], '--rows', '65536']; "
                "from engramprof.cli import main; main()")
        r = subprocess.run([PY, "-c", code, str(mnt / "t.safetensors")], capture_output=True, text=True, cwd=REPO,
                           timeout=60)
        check(r, 1, "No space left on device", "partial file was removed")
        assert os.listdir(mnt) == []
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


# ----------------------------------------------------------------------------- the page-fault read path (real eBPF)

MAPPER = r"""
import mmap, os, signal, sys
# argv: mode (anon | files), then for files: path[:unlink] ...
signal.signal(signal.SIGUSR1, lambda *a: None)
maps = []
if sys.argv[1] == "files":
    for spec in sys.argv[2:]:
        path, _, unlink = spec.partition(":")
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        m.madvise(mmap.MADV_RANDOM)
        os.close(fd)
        if unlink:
            os.unlink(path)
        maps.append(m)
sys.stderr.write("ready\n"); sys.stderr.flush()
signal.pause()
if sys.argv[1] == "anon":  # only anonymous memory: fresh mappings, every page touched
    for _ in range(20):
        a = mmap.mmap(-1, 4 << 20)
        for off in range(0, 4 << 20, mmap.PAGESIZE):
            a[off] = 1
        a.close()
for m in maps:
    s = sum(m[off] for off in range(0, len(m), 16 * mmap.PAGESIZE))
"""


def _traced_mapper(tmp_path, *args, tracer=()):
    """MAPPER under `engramprof syscalls --output --json`; returns (summary, events, stderr)."""
    from engramprof import trace
    from tests.tracing import Proc, engramprof

    w = Proc([PY, "-c", MAPPER, *map(str, args)])
    w.wait_line("ready")
    out = tmp_path / "trace"
    t = Proc(engramprof("syscalls", "--pid", w.pid, "--output", out, "--json", "--sample-hz", "0", *tracer))
    t.wait_line("Tracing")
    os.kill(w.pid, __import__("signal").SIGUSR1)
    rc, _, werr = w.finish()
    assert rc == 0, werr
    trc, tout, terr = t.finish()
    assert trc == 0 and "Traceback" not in terr, terr
    ev = trace.load(out)
    return json.loads(tout), ev[ev["kind"] == "fault"], terr


@pytest.mark.bpf
def test_process_with_only_anonymous_memory(tmp_path):
    """No file mapping of a table: syscalls counts the anonymous faults and records none;
    diagnose says in one line that there is nothing to diagnose (no traceback)."""
    s, faults, _ = _traced_mapper(tmp_path, "anon")
    assert s["calls"] == 0 and s["faults"]["major"] == 0
    # file-backed faults only on the interpreter's own code and libraries (cached pages), none of a table
    assert all(p.startswith(("/usr/", "/lib")) for p in faults["path"]), faults["path"].unique()
    assert s["faults"]["other_faults"] >= 20 * 1024  # every touched anonymous page: counted, not recorded
    from io import StringIO

    from rich.console import Console

    from engramprof.report import syscalls as report_syscalls
    buf = StringIO()
    report_syscalls.print_summary(Console(file=buf, width=80), s)
    assert "no major page fault" in " ".join(buf.getvalue().split())
    # diagnose of such a process: one clear line
    from tests.tracing import Proc, engramprof
    w = Proc([PY, "-c", MAPPER, "anon"])
    w.wait_line("ready")
    d = Proc(engramprof("diagnose", "--pid", w.pid, "--duration", "3"))
    d.wait_line("Tracing")
    os.kill(w.pid, __import__("signal").SIGUSR1)
    w.finish()
    rc, out, err = d.finish()
    assert "Traceback" not in err + out, err
    # its only file-backed faults are on the interpreter's own code and libraries, which are not
    # table reads (the analysis leaves them out): one line, "nothing to diagnose", exit 1
    lines = [l for l in err.splitlines() if l.startswith("engramprof:")]
    assert rc == 1 and len(lines) == 1 and "nothing to diagnose" in lines[0], err
    kept = re.search(r"the recording is kept in (\S+)\)", lines[0])  # kept for the user; the test removes it
    if kept and os.path.basename(os.path.dirname(kept.group(1))).startswith("engramprof-diagnose-"):
        shutil.rmtree(os.path.dirname(kept.group(1)), ignore_errors=True)


@pytest.mark.bpf
def test_faults_on_a_deleted_file_and_on_a_file_not_in_the_layout(tmp_path):
    """A mapping of a file unlinked after mmap: its faults keep the path and are flagged
    path_stale.  A raw file no --layout entry matches: path and offset, no tensor / row; a
    file an entry matches: its tensor and row."""
    pages = 64
    gone, other, ple = tmp_path / "gone.bin", tmp_path / "raw.bin", tmp_path / "ple" / "3.w.bin"
    ple.parent.mkdir()
    for p in (gone, other, ple):
        p.write_bytes(os.urandom(pages * 4096))
    lay = tmp_path / "layout.toml"
    lay.write_text("[[file]]\nmatch = '/(?P<layer>\\d+)\\.(?P<param>\\w+)\\.bin$'\n"
                   "tensor = \"ple.{layer}.{param}\"\nrow_bytes = 256\n")
    s, f, _ = _traced_mapper(tmp_path, "files", f"{gone}:unlink", other, ple, tracer=("--layout", lay))
    assert s["faults"]["faults"] > 0
    g = f[f["path"] == str(gone)]
    assert len(g) > 0 and g["path_stale"].all(), f[["path", "path_stale"]].drop_duplicates()
    o = f[f["path"] == str(other)]
    assert len(o) > 0 and (o["offset"] >= 0).all() and (o["offset"] % 4096 == 0).all()
    assert (o["tensor"].fillna("") == "").all() and (o["row"] == -1).all()
    assert not o["path_stale"].any()
    q = f[f["path"] == str(ple)]
    assert len(q) > 0 and (q["tensor"] == "ple.3.w").all() and (q["row"] == q["offset"] // 256).all()


@pytest.mark.bpf
def test_children_of_a_pid_that_exits_at_once(tmp_path):
    """--children of a process that exits while the probes load: the trace ends by itself
    (target-exit), exit 0, nothing recorded lost, no traceback."""
    import threading

    p = subprocess.Popen(["sleep", "2"])  # the probes take longer than that to load
    threading.Thread(target=p.wait, daemon=True).start()  # reaped as it exits: gone, not a zombie
    try:
        out = tmp_path / "trace"
        r = run("syscalls", "--pid", p.pid, "--children", "--output", out, "--json", "--sample-hz", "0", timeout=120)
    finally:
        p.wait()
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    summary, meta = json.loads(r.stdout), json.loads((out / "meta.json").read_text())
    assert summary["end_reason"] == meta["end_reason"] == "target-exit"
    assert summary["lost_records"] == meta["lost_records"] == 0 and meta["children"]
