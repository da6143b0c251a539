"""Nothing recorded is lost (issue 11, items 1-4): full disks, kill -9, incomplete parts,
lost-record intervals.

The real-eBPF tests drive the lab's serial reader on a warm table: one thread, a few hundred
thousand preadv2 calls a second, and a row plan that depends only on --seed, so a trace can be
compared call for call with :func:`engramprof.lab.workload.planned_reads`.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from engramprof import trace
from engramprof.trace.writer import WriteFailed
from tests.tracing import Proc, engramprof

TOKENS = 1024  # a few thousand calls a step: the loop stays in preadv2, the plan is cheap


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tbl") / "engram.safetensors"
    subprocess.run(engramprof("lab", "make-table", path, "--rows", "32768"), check=True, capture_output=True)
    return path


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str):
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _calls_df(n: int, t0: int = 0) -> pd.DataFrame:
    df = trace.CALL_SCHEMA.empty_table().to_pandas()
    out = {}
    for f in trace.CALL_SCHEMA:
        if pa.types.is_string(f.type):
            out[f.name] = ["/t"] * n
        elif pa.types.is_boolean(f.type):
            out[f.name] = np.zeros(n, dtype=bool)
        else:
            out[f.name] = np.arange(t0, t0 + n, dtype=np.int64)
    del df
    return pd.DataFrame(out)


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


# ---- the writer and the reader, without probes ---------------------------------------------

@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_writer_on_a_full_disk_stops_cleanly_and_keeps_what_it_wrote(tmp_path):
    with small_tmpfs(tmp_path / "mnt", "1m") as mnt:
        w = trace.TraceWriter(mnt / "t")
        written = 0
        rng = np.random.default_rng(0)
        with pytest.raises(WriteFailed):
            for i in range(200):
                df = _calls_df(20_000, t0=written)
                df["offset"] = rng.integers(0, 1 << 40, len(df))  # incompressible
                w.append_calls(df)
                written += len(df)
        assert w.failed is not None and w.failed[0] == "disk-full" and "ENOSPC" in w.failed[1]
        assert 0 < written < 200 * 20_000
        with pytest.raises(WriteFailed):  # no part after the first failure
            w.append_samples("vmstat", pd.DataFrame({"ts_ns": [1]}))
        w.close(end_reason=w.failed[0], totals={"calls": 123})
        meta = json.loads((mnt / "t" / "meta.json").read_text())
        assert meta["complete"] and meta["end_reason"] == "disk-full" and meta["totals"] == {"calls": 123}
        assert "ENOSPC" in meta["write_error"]
        assert not [f for f in _files(mnt / "t") if f.rsplit("/", 1)[-1].startswith(".")]  # no temporary, no reserve
        t = trace.load_bundle(mnt / "t")
        assert len(t.calls) == written == meta["calls_written"]
        assert any("disk-full" in n for n in t.notes)
        assert len(pd.read_parquet(mnt / "t" / "calls")) == written


def test_incomplete_parts_and_leftover_temporaries_are_skipped_with_a_note(tmp_path):
    w = trace.TraceWriter(tmp_path / "t")
    for i in range(3):
        w.append_calls(_calls_df(100, t0=i * 100))
    w.append_samples("vmstat", pd.DataFrame({"ts_ns": [1, 2]}))
    w.append_samples("vmstat", pd.DataFrame({"ts_ns": [3]}))
    w.write_table("latency_log2_by_fd", trace.fd_latency_table({}, str))
    w.close()
    calls = tmp_path / "t" / "calls"
    with open(calls / "part-000001.parquet", "r+b") as f:  # as a kill mid-write left it before
        f.truncate(300)
    (calls / ".part-000003.parquet.99.1.tmp").write_bytes(b"PAR1 half")
    with open(tmp_path / "t" / "samples" / "vmstat" / "part-000001.parquet", "r+b") as f:
        f.truncate(10)
    (tmp_path / "t" / "tables" / "latency_log2_by_fd.parquet").write_bytes(b"garbage")
    for kw in ({}, {"columns": trace.EVENT_READ_COLUMNS, "compact": True}):
        t = trace.load_bundle(tmp_path / "t", **kw)
        assert sorted(t.calls["ts_ns"].tolist()) == list(range(100)) + list(range(200, 300))
        assert any("calls/part-000001.parquet" in n and "not a complete Parquet file" in n for n in t.notes), t.notes
        assert any(".part-000003.parquet.99.1.tmp" in n for n in t.notes), t.notes
        assert t.samples("vmstat")["ts_ns"].tolist() == [1, 2]
        assert any("samples/vmstat/part-000001.parquet" in n for n in t.notes), t.notes
        assert t.table("latency_log2_by_fd") is None
        assert any("tables/latency_log2_by_fd.parquet" in n for n in t.notes), t.notes
    assert len(pd.read_parquet(calls / "part-000000.parquet")) == 100


def test_parts_are_written_under_a_dot_name_then_renamed(tmp_path, monkeypatch):
    """A part is never visible under its final name before it is complete (and fsync'd)."""
    import engramprof.trace.writer as wr

    seen = []
    real_replace, real_fsync = os.replace, os.fsync

    def replace(src, dst):
        seen.append(("replace", Path(src).name, Path(dst).name, Path(dst).exists()))
        return real_replace(src, dst)

    def fsync(fd):
        seen.append(("fsync",))
        return real_fsync(fd)

    monkeypatch.setattr(wr.os, "replace", replace)
    monkeypatch.setattr(wr.os, "fsync", fsync)
    w = trace.TraceWriter(tmp_path / "t")
    w.append_calls(_calls_df(10))
    part = [s for s in seen if s[0] == "replace" and s[2] == "part-000000.parquet"]
    assert part and part[0][1].startswith(".part-000000.parquet.") and part[0][1].endswith(".tmp")
    assert part[0][3] is False  # not there before the rename
    i = seen.index(part[0])
    assert seen[i - 1] == ("fsync",)


# ---- real eBPF -----------------------------------------------------------------------------

def _lab(table: Path, *extra: str) -> Proc:
    lab = Proc(engramprof("lab", "run", "--table", table, "--reader", "serial", "--warm", "--tokens", str(TOKENS),
                          "--json", *extra))
    lab.wait_line("lab: ready")
    return lab


def _stop(proc: Proc) -> None:
    if proc.p.poll() is None:
        proc.p.kill()
    proc.finish(timeout=30)


@pytest.mark.bpf
def test_full_disk_stops_the_recording_and_keeps_every_part(tmp_path, table):
    with small_tmpfs(tmp_path / "mnt", "5m") as mnt:
        lab = _lab(table, "--duration", "120")
        try:
            out = mnt / "tr"
            tracer = Proc(engramprof("syscalls", "--pid", lab.pid, "--duration", "40", "--output", out, "--json"))
            rc, stdout, err = tracer.finish(timeout=120)
        finally:
            _stop(lab)
        lines = [l for l in err.strip().splitlines() if not l.startswith("Tracing ")]
        assert rc == 1, err
        assert len(lines) == 1 and lines[0].startswith("engramprof: disk-full: ENOSPC") and str(out) in lines[0], err
        assert "Traceback" not in err
        summary = json.loads(stdout)
        assert summary["end_reason"] == "disk-full" and summary["duration_s"] < 35
        meta = json.loads((out / "meta.json").read_text())
        assert meta["complete"] is True and meta["end_reason"] == "disk-full" and "ENOSPC" in meta["write_error"]
        # the in-kernel totals are kept: every call, though not every one could be written
        assert meta["totals"]["calls"] == summary["calls"] > meta["calls_written"] > 0
        assert meta["calls_not_written"] > 0
        assert not [f for f in _files(out) if f.rsplit("/", 1)[-1].startswith(".")], _files(out)
        t = trace.load_bundle(out)
        assert len(t.calls) == meta["calls_written"]
        assert len(pd.read_parquet(out / "calls")) == meta["calls_written"]
        for name in t.sample_names:
            t.samples(name)
        assert not [n for n in t.notes if "skipped" in n], t.notes


def _is_subsequence(seq: list, plan: list) -> bool:
    """Every element of ``seq`` appears in ``plan`` in the same order (gaps allowed)."""
    it = iter(plan)
    return all(any(x == y for y in it) for x in seq)


def _planned_sequence(table: Path, n: int, seed: int) -> list[tuple[int, int]]:
    from engramprof.lab.workload import Plan, batch_reads
    from engramprof.tables import safetensors as layout

    plan = Plan(layout.load(str(table)), TOKENS, 6, 1.1, seed)
    seq: list[tuple[int, int]] = []
    while len(seq) < n:
        seq += batch_reads(plan.next_batch())
    return seq[:n]


@pytest.mark.bpf
def test_kill_9_at_any_moment_leaves_a_loadable_prefix(tmp_path, table):
    """6 recorders (ENGRAMPROF_KILLS) killed with SIGKILL at a random moment of their recording, each against a
    fresh serial lab reader started by SIGUSR1 once the probes are attached (so the trace must
    be exactly the first N reads of the plan).  Slow: about 1.5-2 minutes, since each recorder
    compiles its probes (~5 s on the shared 2-core machines) and records up to 3.2 s; the next
    lab starts while the current recorder compiles.  (8 kills took 118-137 s of the suite's
    40-minute budget; 6 still put one kill in each 0.5 s slice of 0.05-3.2 s.)"""
    rng = random.Random(int(os.environ.get("ENGRAMPROF_KILL_SEED", "11")))
    kills = int(os.environ.get("ENGRAMPROF_KILLS", "6"))
    delay = ("--start-delay", "120", "--duration", "30")
    # a random moment in each of `kills` equal slices of 0.05-3.2 s, in random order
    waits = [0.05 + (k + rng.random()) * 3.15 / kills for k in range(kills)]
    rng.shuffle(waits)
    nxt = _lab(table, "--seed", "0", *delay)
    results = []
    losses: list[int] = []
    for k in range(kills):
        lab, seed = nxt, k
        out = tmp_path / f"t{k}"
        tracer = Proc(engramprof("syscalls", "--pid", lab.pid, "--output", out, "--stack-hz", "0"))  # no py-spy: every record kept
        try:
            nxt = _lab(table, "--seed", str(k + 1), *delay) if k + 1 < kills else None
            tracer.wait_line("Tracing")
            os.kill(lab.pid, signal.SIGUSR1)
            wait = waits[k]
            time.sleep(wait)
            tracer.p.kill()
            tracer.finish(timeout=30)
        finally:
            _stop(lab)
        t = trace.load_bundle(out)  # never refuses
        meta = t.meta
        assert meta["complete"] is False
        for name in t.sample_names:
            t.samples(name)  # never raises (a series whose only part was being written is None)
        # the reader's preadv2 calls on the table (page faults on libraries may be recorded too)
        c = t.calls[(t.calls["kind"] == "syscall") & (t.calls["path"] == os.path.realpath(table))]
        seq = list(zip(c["offset"].tolist(), c["size"].tolist()))
        lost = t.samples("lost_records")
        if lost is None:  # nothing was lost: the trace is exactly the plan's first reads
            assert seq == _planned_sequence(table, len(seq), seed), f"kill {k} after {wait:.2f} s: not a prefix"
        else:  # a drain starved of CPU lost records: the trace says so, and what it kept is in order
            n_lost = int(lost["lost"].sum())
            assert n_lost > 0  # the trace's own count of what it missed, and when
            assert _is_subsequence(seq, _planned_sequence(table, len(seq) + n_lost, seed)), \
                f"kill {k} after {wait:.2f} s: what was kept is not the plan's order, less the lost records"
            losses.append(k)
        assert c["tid"].nunique() <= 1
        # what was flushed about a second before the kill is there (samples and the running totals)
        results.append((k, round(wait, 2), len(seq), meta.get("totals", {}).get("calls", 0),
                        t.samples("vmstat") is not None, t.table("latency_log2_by_fd") is not None,
                        [n for n in t.notes if "temporary" in n]))
    if nxt is not None:
        _stop(nxt)
    # what was flushed about a second before a kill is there: calls, samples, the kernel's
    # histograms and running totals (kills after 2.5 s; a loaded machine may delay a flush)
    late = [r for r in results if r[1] > 2.5]
    assert late and all(r[2] > 0 and r[3] > 0 and r[4] and r[5] for r in late), results
    # not vacuous: a fair part of the kills land once reads are recorded (on a loaded machine the
    # reader starts later after SIGUSR1, so fewer of the early kills do: 9 of 20 at load 10)
    assert sum(1 for r in results if r[2] > 0) >= kills // 4, results
    # the exact prefix comparison carries the test: most kills lost nothing
    assert len(losses) <= kills // 4, (losses, results)


@pytest.mark.bpf
def test_lost_records_are_recorded_as_intervals_that_cover_the_hole(tmp_path, table):
    """The recorder stops draining for 2 s (a test hook) on an 8 MiB ring: the kernel drops
    records; the lost_records rows cover the pause and add up to the kernel's total."""
    from engramprof.record.recorder import Recorder

    lab = _lab(table, "--duration", "60")
    try:
        tracer = Recorder(lab.pid, output=str(tmp_path / "t"), sample_hz=0)
        tracer.syscalls.config.ring_pages = 2048
        tracer.start()
        pause = {}

        def pauser():
            time.sleep(1.0)
            pause["start"] = time.monotonic_ns()
            tracer.pause_draining.set()
            time.sleep(2.0)
            tracer.pause_draining.clear()
            pause["end"] = time.monotonic_ns()

        th = threading.Thread(target=pauser)
        th.start()
        tracer.run(duration=4.5)
        th.join()
        summary = tracer.finish()
    finally:
        _stop(lab)
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())
    t = trace.load_bundle(tmp_path / "t")
    rows = t.samples("lost_records")
    lost = meta["totals"]["lost_records"]
    assert lost > 10_000 and summary["lost_records"] == lost == meta["lost_records"]
    assert rows is not None and int(rows["lost"].sum()) == lost
    assert len(rows) == meta["lost_record_intervals"] == meta["samples_written"]["lost_records"]
    assert (rows["start_ns"] < rows["end_ns"]).all()
    assert (rows["start_ns"].to_numpy()[1:] >= rows["end_ns"].to_numpy()[:-1]).all()  # disjoint, in order
    # the hole of the pause: one row from the last drain before it to the first drain after it
    # (other rows are real losses too: a drain that a busy machine delayed, or the start-up; a
    # drain under way when the pause was asked for ends just after its start: 0.1 s of margin)
    inside = (pause["start"] + 10**8, pause["end"] - 10**8)
    over = rows[(rows["end_ns"] > inside[0]) & (rows["start_ns"] < inside[1])]
    assert len(over) == 1, (rows, pause)
    hole = over.iloc[0]
    assert hole["lost"] > 10_000, rows
    assert pause["start"] - 2 * 10**8 <= hole["start_ns"] <= pause["start"] + 10**8, (rows, pause)
    assert pause["end"] - 10**8 <= hole["end_ns"] <= pause["end"] + 2 * 10**8, (rows, pause)
    assert summary["calls"] == summary["recorded"] + lost + summary["filtered_short"] + summary["partial_at_start"]
