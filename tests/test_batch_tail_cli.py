"""`engramprof batch-tail` end to end on bundles written with TraceWriter (no root needed)."""
from __future__ import annotations

import json
import time
import os
import sys

import numpy as np
import pandas as pd
import pytest

from engramprof.trace import CALL_SCHEMA, CONTRACT_COLUMNS, TraceWriter

try:
    from test_attribution import decode_trace
except ImportError:
    from tests.test_attribution import decode_trace

JSON_KEYS = {"batches", "slow_ms", "frac_batches_with_slow_call", "call_ms", "batch_ms", "inflight_ms", "share",
             "tail_share", "verdict", "gap_ms", "batch_source", "missing_evidence", "notes"}
SHARE_KEYS = {"residency", "reclaim", "storage", "python-scheduling", "cpu-copy", "unexplained"}


def run(args, capsys, monkeypatch):
    from engramprof import cli

    monkeypatch.setattr(sys, "argv", ["engramprof", *map(str, args)])
    with pytest.raises(SystemExit) as ei:
        cli.main()
    out = capsys.readouterr()
    return ei.value.code or 0, out.out, out.err


def _full(calls: pd.DataFrame) -> pd.DataFrame:
    calls = calls.copy()
    for name in CALL_SCHEMA.names:
        if name not in calls.columns:
            calls[name] = {"syscall": "preadv2", "tensor": "engram.weight", "path_stale": False, "fd": 7,
                           "row": -1}.get(name, 0)
    calls["row"] = calls["offset"] // 4096
    for name in ("pages_added", "bio_count", "bio_ns", "reclaim_ns", "offcpu_ns", "runq_ns"):
        calls[name] = calls[name].round().astype(np.int64)
    return calls[CALL_SCHEMA.names]


def write_bundle(path, calls, samples=None, close=True):
    w = TraceWriter(path, meta={"pid": 4242})
    half = len(calls) // 2
    w.append_calls(_full(calls.iloc[:half]))
    w.append_calls(_full(calls.iloc[half:]))
    for name, df in (samples or {}).items():
        w.append_samples(name, df)
    if close:
        w.close()
    return path


@pytest.fixture(scope="module")
def pool_trace():
    kinds = ["python-scheduling"] * 9 + ["storage"] + ["python-scheduling"] * 5
    return decode_trace(kinds=kinds, n_batches=15, seed=21)


def _samples(calls, markers):
    tids = np.unique(calls["tid"])
    t0, t1 = int(markers["start_ns"].min()) - 10**8, int(markers["end_ns"].max()) + 2 * 10**8
    xs = np.arange(t0, t1, 10**8)
    thr = pd.DataFrame([(x, t, "pool", (x - t0) // 10**5, (x - t0) // 10**6, 0.0, 0.0) for t in tids for x in xs],
                       columns=["ts_ns", "tid", "name", "ctx_voluntary", "ctx_involuntary", "utime_s", "stime_s"])
    vm = pd.DataFrame({"ts_ns": xs, "workingset_refault_file": np.zeros(len(xs), dtype=np.int64)})
    # per-interval stall (the samplers' contract): 1 ms of every 100 ms = 1%
    psi = pd.DataFrame([(x, r, 1000, 0) for r in ("cpu", "memory", "io") for x in xs],
                       columns=["ts_ns", "resource", "some_us", "full_us"])
    return {"threads": thr, "vmstat": vm, "psi": psi}


def test_json_output_has_the_documented_keys(tmp_path, capsys, monkeypatch, pool_trace):
    calls, markers = pool_trace
    tr = write_bundle(tmp_path / "t", calls, _samples(calls, markers))
    code, out, err = run(["batch-tail", tr, "--json"], capsys, monkeypatch)
    assert code == 0, err
    s = json.loads(out)
    assert JSON_KEYS <= set(s)
    assert set(s["share"]) == SHARE_KEYS and set(s["tail_share"]) == SHARE_KEYS
    assert s["batches"] == 15 and s["batch_source"] == "inferred" and s["gap_ms"] > 0
    # the overall verdict is time-weighted: one ~27 ms storage batch outweighs 14 ~1 ms pool batches
    assert s["verdict"] == "storage" and s["tail_verdict"] == "storage"
    assert s["verdict_counts"]["python-scheduling"] == 14 and s["verdict_counts"]["storage"] == 1
    assert s["frac_batches_with_slow_call"] == pytest.approx(1 / 15)
    assert set(s["call_ms"]) == {"p50", "p99"}
    assert s["samples_used"] == {"threads": ["ts_ns", "tid", "ctx_voluntary", "ctx_involuntary"],
                                 "vmstat": ["ts_ns", "workingset_refault_file"],
                                 "psi": ["ts_ns", "resource", "some_us"]}
    assert s["evidence"]["ctx_switches_per_batch"]["p50"] > 0
    assert s["evidence"]["psi_some_pct"]["io"] == pytest.approx(1.0)
    assert s["missing_evidence"] == []


def test_rich_output_speaks_the_field_reports_terms(tmp_path, capsys, monkeypatch, pool_trace):
    calls, markers = pool_trace
    tr = write_bundle(tmp_path / "t", calls)
    mk = tmp_path / "m.jsonl"
    mk.write_text("".join(json.dumps({"start_ns": int(a), "end_ns": int(b), "step": i}) + "\n"
                          for i, (a, b, _) in enumerate(markers.itertuples(index=False))) + "garbage\n{}\n")
    code, out, err = run(["batch-tail", tr, "--markers", mk, "--slow-ms", "4"], capsys, monkeypatch)
    assert code == 0, err
    assert "of batches had at least one call slower than 4 ms" in out
    assert "of batch time is outside the kernel read path" in out
    assert "verdict: storage" in out and "python-scheduling 14" in out
    assert "Where batch time went" in out and "Slowest batches" in out
    assert "skipped 2 bad line" in out
    code, out, _ = run(["batch-tail", tr, "--markers", mk, "--json"], capsys, monkeypatch)
    s = json.loads(out)
    assert s["batch_source"] == "markers" and s["markers"]["bad_lines"] == 2 and s["gap_ms"] is None


def test_plot_is_created_exclusively(tmp_path, capsys, monkeypatch, pool_trace):
    calls, _ = pool_trace
    tr = write_bundle(tmp_path / "t", calls)
    png = tmp_path / "p.png"
    code, out, err = run(["batch-tail", tr, "--json", "--plot", png], capsys, monkeypatch)
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(out)["plot"] == str(png)
    code, _, err = run(["batch-tail", tr, "--plot", png], capsys, monkeypatch)
    assert code == 2 and "already exists" in err
    link = tmp_path / "link.png"
    os.symlink(tmp_path / "target.png", link)  # dangling symlink: must not be followed
    code, _, err = run(["batch-tail", tr, "--plot", link], capsys, monkeypatch)
    assert code == 2 and "already exists" in err and not (tmp_path / "target.png").exists()


def test_trace_without_evidence_columns(tmp_path, capsys, monkeypatch, pool_trace):
    calls, _ = pool_trace
    bare = tmp_path / "bare.parquet"
    calls[CONTRACT_COLUMNS].to_parquet(bare)
    code, out, err = run(["batch-tail", bare, "--json"], capsys, monkeypatch)
    assert code == 0, err
    s = json.loads(out)
    assert s["missing_evidence"] == ["pages_added", "bio_count", "bio_ns", "reclaim_ns", "offcpu_ns", "runq_ns"]
    assert s["share"]["unexplained"] > 0
    code, out, err = run(["batch-tail", bare], capsys, monkeypatch)
    assert code == 0 and "missing evidence columns" in out


@pytest.mark.parametrize("case", ["empty", "corrupt-meta", "no-such", "wall-markers", "bad-markers",
                                  "bad-option"])
def test_bad_input_gives_one_line_and_nonzero_exit(tmp_path, capsys, monkeypatch, pool_trace, case):
    calls, markers = pool_trace
    tr = tmp_path / "t"
    args = ["batch-tail", tr]
    if case == "empty":
        TraceWriter(tr).close()
    else:
        write_bundle(tr, calls)
    if case == "corrupt-meta":
        (tr / "meta.json").write_text("{not json")
    elif case == "corrupt-part":
        (tr / "calls" / "part-000001.parquet").write_bytes(b"PAR1 this is not parquet")
    elif case == "no-such":
        args = ["batch-tail", tmp_path / "nope"]
    elif case == "wall-markers":
        mk = tmp_path / "m.jsonl"
        now = int(time.time()) * 10**9  # wall-clock markers of today: the trace's own date
        mk.write_text("".join(json.dumps({"start_ns": int(a) + now, "end_ns": int(b) + now}) + "\n"
                              for a, b, _ in markers.itertuples(index=False)))
        args += ["--markers", mk]
    elif case == "bad-markers":
        mk = tmp_path / "m.jsonl"
        mk.write_text("nope\n[]\n")
        args += ["--markers", mk]
    elif case == "bad-option":
        args += ["--gap-ms", "-3"]
    code, out, err = run(args, capsys, monkeypatch)
    assert code != 0
    assert "Traceback" not in err and "Traceback" not in out
    msg = err.strip()
    assert msg.startswith("engramprof: ") and "\n" not in msg, msg
    expect = {"empty": "no calls", "corrupt-meta": "corrupt metadata",
              "no-such": "no such trace", "wall-markers": "wall-clock", "bad-markers": "2 bad lines",
              "bad-option": "--gap-ms"}[case]
    assert expect in msg


def test_incomplete_part_is_skipped_with_a_note_naming_it(tmp_path, capsys, monkeypatch, pool_trace):
    """A part that is not a complete Parquet file (a recorder killed before parts were renamed
    into place atomically) no longer refuses the bundle: the others are analysed (issue 11)."""
    calls, _ = pool_trace
    tr = write_bundle(tmp_path / "t", calls)
    (tr / "calls" / "part-000001.parquet").write_bytes(b"PAR1 this is not parquet")
    code, out, err = run(["batch-tail", tr, "--json"], capsys, monkeypatch)
    assert code == 0, err
    s = json.loads(out)
    assert s["calls"] == len(calls) // 2
    assert any("calls/part-000001.parquet" in n and "not a complete Parquet file" in n for n in s["notes"]), s["notes"]


def test_unclosed_trace_is_analysed_with_a_note(tmp_path, capsys, monkeypatch, pool_trace):
    calls, _ = pool_trace
    tr = write_bundle(tmp_path / "t", calls, close=False)
    code, out, _ = run(["batch-tail", tr, "--json"], capsys, monkeypatch)
    assert code == 0
    assert any("not closed cleanly" in n for n in json.loads(out)["notes"])


def test_markers_carried_by_the_bundle_are_used(tmp_path, capsys, monkeypatch):
    from engramprof.analysis.diagnose import keep_markers

    calls, markers = decode_trace("python-scheduling", n_batches=12, seed=41)
    tr = write_bundle(tmp_path / "t", calls)
    mk = tmp_path / "m.jsonl"
    mk.write_text("".join(json.dumps({"start_ns": int(a), "end_ns": int(b)}) + "\n"
                          for a, b in zip(markers["start_ns"], markers["end_ns"])))
    keep_markers(str(mk), str(tr))
    assert (tr / "markers.jsonl").read_bytes() == mk.read_bytes()
    keep_markers(str(mk), str(tr))  # never overwrites (O_EXCL): a note, no error
    code, out, err = run(["batch-tail", tr, "--json"], capsys, monkeypatch)
    assert code == 0, err
    assert json.loads(out)["batch_source"] == "markers"
