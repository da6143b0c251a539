"""markers: batch round trip, safe file creation, bad-line counting, stdlib-only."""
from __future__ import annotations

import ast
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from engramprof import markers


def test_batch_round_trip(tmp_path):
    p = tmp_path / "m.jsonl"
    before = time.monotonic_ns()
    with markers.MarkerWriter(p) as w:
        with markers.batch(w, step=1, rows=96) as b:
            time.sleep(0.002)
            b["late"] = "yes"
        with w.batch(step=2):
            pass
    after = time.monotonic_ns()
    recs, bad = markers.read_markers(p)
    assert bad == 0 and len(recs) == 2
    a, c = recs
    assert before <= a["start_ns"] and a["end_ns"] - a["start_ns"] >= 2_000_000 and c["end_ns"] <= after
    assert (a["step"], a["rows"], a["late"], c["step"]) == (1, 96, "yes", 2)
    assert a["tid"] == threading.get_native_id()
    assert list(a)[:3] == ["start_ns", "end_ns", "tid"]


def test_batch_by_path_shares_one_writer_and_close_all_flushes(tmp_path):
    p = tmp_path / "m.jsonl"
    for i in range(3):
        with markers.batch(p, i=i):
            pass
    with markers.batch(str(p), i=3):
        pass
    markers.close_all()
    recs, bad = markers.read_markers(p)
    assert [r["i"] for r in recs] == [0, 1, 2, 3] and bad == 0


def test_exception_is_recorded_and_propagates(tmp_path):
    p = tmp_path / "m.jsonl"
    w = markers.MarkerWriter(p)
    with pytest.raises(RuntimeError):
        with markers.batch(w, step=0):
            raise RuntimeError("boom")
    w.close()
    assert markers.read_markers(p)[0][0]["error"] == "RuntimeError"
    with pytest.raises(ValueError):
        w.write(1, 2)


def test_reserved_keys_rejected(tmp_path):
    with markers.MarkerWriter(tmp_path / "m") as w, pytest.raises(ValueError):
        markers.batch(w, start_ns=5)


def test_flush_interval(tmp_path):
    p = tmp_path / "m.jsonl"
    w = markers.MarkerWriter(p, flush_s=3600)
    w.write(1, 2)
    assert p.read_text() == ""  # buffered
    w.flush()
    assert len(p.read_text().splitlines()) == 1
    w.close()
    w2 = markers.MarkerWriter(tmp_path / "n.jsonl", flush_s=0)
    w2.write(1, 2)
    assert len((tmp_path / "n.jsonl").read_text().splitlines()) == 1  # flushed at once
    w2.close()


def test_threads_never_interleave_lines(tmp_path):
    p = tmp_path / "m.jsonl"
    w = markers.MarkerWriter(p, flush_s=0)

    def work(k):
        for i in range(200):
            with w.batch(k=k, i=i, pad="x" * 50):
                pass

    ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    w.close()
    recs, bad = markers.read_markers(p)
    assert bad == 0 and len(recs) == 800
    assert len({r["tid"] for r in recs}) == 4


def test_safe_creation(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(victim)
    with pytest.raises(markers.MarkerFileError):
        markers.MarkerWriter(link)
    assert victim.read_text() == "precious\n"
    with pytest.raises(markers.MarkerFileError):
        markers.MarkerWriter(tmp_path)  # a directory
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(markers.MarkerFileError):
        markers.MarkerWriter(fifo)  # must not hang
    # an existing regular file of ours is appended to, unless exclusive
    own = tmp_path / "own.jsonl"
    own.write_text('{"start_ns": 1, "end_ns": 2}\n')
    with markers.MarkerWriter(own) as w:
        w.write(3, 4)
    assert [r["start_ns"] for r in markers.read_markers(own)[0]] == [1, 3]
    with pytest.raises(markers.MarkerFileError, match="already exists"):
        markers.MarkerWriter(own, exclusive=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
def test_refuses_someone_elses_file(tmp_path):
    theirs = tmp_path / "theirs.jsonl"
    theirs.write_text("")
    os.chown(theirs, 65534, 65534)
    # we are root, the file belongs to nobody: refusing it is the rule ("a regular file of ours")
    with pytest.raises(markers.MarkerFileError, match="owned by this user"):
        markers.MarkerWriter(theirs)
    assert theirs.read_text() == ""


def test_bad_lines_are_counted(tmp_path):
    p = tmp_path / "m.jsonl"
    lines = [
        '{"start_ns": 10, "end_ns": 20, "step": 0}',
        "not json",
        "[1, 2]",
        '{"start_ns": 10}',
        '{"start_ns": 30, "end_ns": 20}',
        '{"start_ns": true, "end_ns": 20}',
        '{"start_ns": 1.5, "end_ns": 20}',
        '{"start_ns": "1", "end_ns": 20}',
        "",
        '{"start_ns": 40, "end_ns": 50, "extra": [1]}',
        '{"start_ns": 60, "end_',  # truncated by a crash
    ]
    p.write_text("\n".join(lines))
    recs, bad = markers.read_markers(p)
    assert [r["start_ns"] for r in recs] == [10, 40] and bad == 8
    df, bad2 = markers.read_markers_df(p)
    assert bad2 == 8 and list(df["start_ns"]) == [10, 40] and df["end_ns"].dtype == np.int64
    assert "step" in df.columns and "extra" in df.columns


def test_read_markers_df_empty(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_bytes(b"\xff\xfe garbage\n")
    df, bad = markers.read_markers_df(p)
    assert bad == 1 and len(df) == 0 and {"start_ns", "end_ns"} <= set(df.columns)
    assert df["start_ns"].dtype == np.int64


def test_markers_module_is_stdlib_only():
    src = Path(markers.__file__).read_text()
    top = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            top |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            top.add(node.module.split(".")[0])
    assert top - {"__future__"} <= set(sys.stdlib_module_names) | {"pandas"}
    # pandas only inside read_markers_df, imported lazily
    mod_level = {n.names[0].name for n in ast.parse(src).body if isinstance(n, ast.Import)}
    assert "pandas" not in mod_level


def test_batch_overhead_is_small(tmp_path):
    with markers.MarkerWriter(tmp_path / "m.jsonl") as w:
        t0 = time.perf_counter()
        for i in range(2000):
            with w.batch(step=i, rows=96):
                pass
        per = (time.perf_counter() - t0) / 2000
    assert per < 200e-6  # a few µs normally; generous for a shared 2-core machine
